// Launchers between src/cuda/backend.cu (dispatch) and the kernels.
#pragma once

#include <cuda_runtime.h>

#include "common/params.h"
#include "common/rules.h"
#include "api/kernel_choice.h"
#include "api/backend.h"

namespace flashattn {
namespace cuda {

// The launchers of one compiled (element type, head dim) instance, defined in
// src/cuda/launch_template.h and instantiated by src/cuda/instances/fwd_<dtype>_hdim<D>.cu.
// Element is cutlass::half_t or cutlass::bfloat16_t; params.head_dim <= kHeadDim.
// num_splits == 1: writes o (and lse); num_splits > 1: the splits' partials, then merges them.
template <typename Element, int kHeadDim>
void run_fwd(const AttnParams& params, const KernelChoice& choice, cudaStream_t stream);
// The same instance reading e4m3 K/V (and, kQFp8, e4m3 Q): launch_template.h.
template <typename Element, int kHeadDim, bool kQFp8>
void run_fwd_fp8(const AttnParams& params, const KernelChoice& choice, cudaStream_t stream);
template <typename Element, int kHeadDim>
DecodeSlots decode_slots(int device_index, bool paged);

// Merges the split partials into o and lse (src/cuda/combine.cu); programmatic: may launch as a
// programmatic dependent of the attention kernel.
void run_combine(const AttnParams& params, bool programmatic, cudaStream_t stream);

// Appends k_new/v_new into the cache with rotary, and rotates q into q_rot (src/cuda/append.cu).
void run_append_kernel(const AppendParams& params, bool programmatic, cudaStream_t stream);

// Whether kernel can launch as a programmatic dependent (KernelLaunch::
// as_programmatic_dependent): the binary that runs on the current device was compiled from PTX
// of sm_90 or newer (cudaFuncAttributes::ptxVersion), so that its griddepcontrol.wait is there
// (sm_80 code, JIT-compiled for a newer GPU, has none). Cached per kernel and device.
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
  // (cudaClusterSchedulingPolicyLoadBalancing, D-35).
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
  // A programmatic dependent of the kernel before it in the stream (D-39), where `wanted` (the
  // kernel choice) and may_launch_as_programmatic_dependent(kernel, device_index) allow, else
  // launched plainly: its CTAs may become resident as that kernel's CTAs exit, and wait in
  // griddepcontrol.wait (grid_dependence.h wait_for_previous_grid) until its writes are visible.
  void as_programmatic_dependent(const void* kernel, int device_index, bool wanted) {
    if (!wanted || !may_launch_as_programmatic_dependent(kernel, device_index)) return;
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

// Throws flashattn::Error(runtime) naming the call and the CUDA error.
void check_cuda(cudaError_t err, const char* what);
void check_launch(const char* kernel_name);

}  // namespace cuda
}  // namespace flashattn
