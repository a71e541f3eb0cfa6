// Launchers between src/cuda/backend.cu (dispatch) and the kernels.
#pragma once

#include <cuda_runtime.h>

#include "common/params.h"
#include "common/rules.h"

namespace flashattn {
namespace cuda {

// The attention kernel for one compiled (element type, head dim) instance, defined in
// src/cuda/instances/fwd_<dtype>_hdim<D>.cu. Element is cutlass::half_t or cutlass::bfloat16_t.
// params.head_dim <= kHeadDim (loads/stores are predicated on the real head dim).
// num_splits == 1: writes o (and lse); num_splits > 1: writes o_accum / lse_accum only.
template <typename Element, int kHeadDim>
void run_fwd(const AttnParams& params, cudaStream_t stream);

// Merges the split partials into o and lse (src/cuda/combine.cu).
void run_combine(const AttnParams& params, cudaStream_t stream);

// Appends k_new/v_new into the cache with rotary, and rotates q into q_rot (src/cuda/append.cu).
void run_append_kernel(const AppendParams& params, cudaStream_t stream);

// True when the device runs the sm_90a kernels (compute capability 9.0) and the environment
// does not set FLASHATTN_NO_WGMMA=1 (a switch for testing and timing the mma.sync kernels on
// Hopper). Cached per device.
bool device_has_wgmma(int device_index);

// Whether a split decode call may merge its splits inside thread-block clusters
// (AttnParams::cluster_combine): the decode tile, 2..kMaxClusterSplits splits, a device that
// runs the sm_90a kernels, and FLASHATTN_NO_CLUSTER_COMBINE=1 unset (a switch for testing and
// timing the combine kernel on Hopper).
bool may_combine_splits_in_cluster(const AttnParams& params);
// Whether kernel may launch as a programmatic dependent (KernelLaunch::
// as_programmatic_dependent): the binary that runs on the current device was compiled from PTX
// of sm_90 or newer (cudaFuncAttributes::ptxVersion), so that its griddepcontrol.wait is there
// (sm_80 code, JIT-compiled for a newer GPU, has none), and FLASHATTN_NO_PDL=1 is unset (a switch
// for timing and testing both launches on one GPU). Cached per kernel and device.
bool may_launch_as_programmatic_dependent(const void* kernel, int device_index);

// cudaLaunchKernelEx's configuration of one launch, with the attributes a decode kernel may ask
// for. Not copyable: config points at attributes.
struct KernelLaunch {
  cudaLaunchAttribute attributes[3]{};  // cluster dimension and placement, programmatic dependence
  cudaLaunchConfig_t config{};
  KernelLaunch(dim3 grid, int threads, int smem_bytes, cudaStream_t stream) {
    config.gridDim = grid;
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    config.attrs = attributes;
    config.numAttrs = 0;
  }
  // The grid in clusters of `cluster` CTAs (each dimension divides the grid's), which the
  // hardware places on the SMs of a GPC as it balances their load
  // (cudaClusterSchedulingPolicyLoadBalancing). Measured against the default placement
  // (docs/PERF.md, session 15 runs 5-6): batch 8 x 16k with 4 splits in clusters 1.0-2.3 us
  // faster, 8 x 4k and 8 x 8k 0.7-1.3 us; the spread policy measured no different from the
  // default.
  void in_clusters(dim3 cluster) {
    cudaLaunchAttribute& dim = attributes[config.numAttrs++];
    dim.id = cudaLaunchAttributeClusterDimension;
    dim.val.clusterDim.x = cluster.x;
    dim.val.clusterDim.y = cluster.y;
    dim.val.clusterDim.z = cluster.z;
    cudaLaunchAttribute& placement = attributes[config.numAttrs++];
    placement.id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
    placement.val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicyLoadBalancing;
  }
  // A programmatic dependent of the kernel before it in the stream, where
  // may_launch_as_programmatic_dependent(kernel, device_index) allows (else launched plainly):
  // its CTAs may become resident as that kernel's CTAs exit, and wait in griddepcontrol.wait
  // (grid_dependence.h wait_for_previous_grid) until its writes are visible.
  void as_programmatic_dependent(const void* kernel, int device_index) {
    if (!may_launch_as_programmatic_dependent(kernel, device_index)) return;
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;
};

// Whether clusters of `cluster` CTAs of kernel (threads, dynamic smem), launched as
// KernelLaunch::in_clusters does, can be resident on the device (cudaOccupancyMaxActiveClusters
// > 0; false where the device has no clusters). Cached per kernel, device and cluster shape.
bool cluster_fits(const void* kernel, int device_index, dim3 cluster, int threads, int smem_bytes);

// The CTAs of kernel (threads, dynamic smem) resident on the device at once: SMs x
// cudaOccupancyMaxActiveBlocksPerMultiprocessor (0 if the query fails), after allowing the
// kernel that much dynamic shared memory. Cached per kernel and device (the device current).
int resident_ctas(const void* kernel, int device_index, int threads, int smem_bytes);

// FLASHATTN_PERSISTENT_DECODE=off|always forces the decode tile's persistent grid off, or on
// for every call it serves (rules.h persistent_decode_ctas); unset, automatic. For testing and
// timing both grids on one GPU.
PersistentDecode persistent_decode_env();

// FLASHATTN_SPLIT_HEADS=off|always forces the decode tile's heads-split kernel never, or for
// every call it serves (rules.h decode_warps_split_heads); unset, automatic. For testing and
// timing both kernels on one GPU.
SplitHeads split_heads_env();

// FLASHATTN_WGMMA_TILE=wide|narrow|narrow96 forces that wgmma tile where it is compiled
// (fwd_launch_template.h launch_wgmma picks otherwise); for timing the tiles on one GPU.
enum class WgmmaTileEnv { automatic, wide, narrow, narrow96 };
WgmmaTileEnv wgmma_tile_env();

// FLASHATTN_TILE_ORDER=heavy_first|per_unit forces that order of the query tiles
// (AttnParams::heavy_tiles_first); unset, rules.h heavy_tiles_first picks. For timing the
// orders on one GPU.
enum class TileOrderEnv { automatic, per_unit, heavy_first };
TileOrderEnv tile_order_env();

// Throws flashattn::Error(runtime) naming the call and the CUDA error.
void check_cuda(cudaError_t err, const char* what);
void check_launch(const char* kernel_name);

}  // namespace cuda
}  // namespace flashattn
