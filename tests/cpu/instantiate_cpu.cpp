// The shared sweeps (tests/common) on the CPU backend.
#include "sweeps.h"

namespace fa_test {
FA_INSTANTIATE_SWEEPS(Cpu, flashattn::Device::cpu);
}  // namespace fa_test
