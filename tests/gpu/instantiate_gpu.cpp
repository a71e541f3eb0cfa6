// The shared sweeps (tests/common) on the CUDA backend: once with the automatic kernel choice,
// then once per kernel, every call forced onto it where it serves the call (api/kernel_choice.h),
// and the split decode sweeps once more with the combine kernel and plain launches. Every case
// skips cleanly when no CUDA device is visible or flashattn was built without CUDA.
#include "sweeps.h"

namespace fa_test {
using flashattn::Kernel;

FA_INSTANTIATE_SWEEPS(Cuda, flashattn::Device::cuda);

FA_INSTANTIATE_PREFILL_SWEEPS_ON(CudaMma, flashattn::Device::cuda, forced(Kernel::mma));
FA_INSTANTIATE_PREFILL_SWEEPS_ON(CudaWgmma, flashattn::Device::cuda, forced(Kernel::wgmma));
FA_INSTANTIATE_PREFILL_SWEEPS_ON(CudaWarpspec, flashattn::Device::cuda, forced(Kernel::warpspec));
// Three warpspec CTAs: each takes many query tiles in turn (its pipelines and Q's buffer carried
// from tile to tile), heaviest first across units (the order D-89's model keeps only for large
// calls, which the automatic sweep seldom reaches).
inline flashattn::KernelOverride warpspec_on_three_ctas() {
  flashattn::KernelOverride o = forced(Kernel::warpspec);
  o.prefill_ctas = 3;
  o.tile_order = flashattn::TileOrder::heavy_first;
  return o;
}
FA_INSTANTIATE_PREFILL_SWEEPS_ON(CudaWarpspecThreeCtas, flashattn::Device::cuda, warpspec_on_three_ctas());
FA_INSTANTIATE_DECODE_SWEEPS_ON(CudaSplitkeys, flashattn::Device::cuda, forced(Kernel::splitkeys));
FA_INSTANTIATE_DECODE_SWEEPS_ON(CudaDeep, flashattn::Device::cuda, forced(Kernel::deep));
FA_INSTANTIATE_DECODE_SWEEPS_ON(CudaDims, flashattn::Device::cuda, forced(Kernel::dims));
FA_INSTANTIATE_DECODE_SWEEPS_ON(CudaPersistent, flashattn::Device::cuda, forced(Kernel::persistent));
FA_INSTANTIATE_DECODE_SWEEPS_ON(CudaHeads, flashattn::Device::cuda, forced(Kernel::heads));

// Split decode merged by the combine kernel, every launch plain, prefill tiles in unit order.
inline flashattn::KernelOverride plain_launches() {
  flashattn::KernelOverride o;
  o.cluster_combine = false;
  o.programmatic_launch = false;
  o.tile_order = flashattn::TileOrder::per_unit;
  return o;
}
FA_INSTANTIATE_DECODE_SWEEPS_ON(CudaPlain, flashattn::Device::cuda, plain_launches());

}  // namespace fa_test
