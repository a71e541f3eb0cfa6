// The shared sweeps (tests/common) on the CUDA backend. Every case skips cleanly when no CUDA
// device is visible or flashattn was built without CUDA.
#include "sweeps.h"

namespace fa_test {
FA_INSTANTIATE_SWEEPS(Cuda, flashattn::Device::cuda);
}  // namespace fa_test
