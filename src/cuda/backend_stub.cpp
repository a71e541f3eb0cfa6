// The CUDA backend of a CPU-only build (FLASHATTN_CUDA=OFF): reports "not available" and
// refuses every launch, so the API layer needs no #ifdef.
#include <string>

#include "api/backend.h"

namespace flashattn {
namespace cuda {

namespace {
[[noreturn]] void refuse(const char* what) {
  throw Error(Error::Kind::unsupported,
              std::string("CUDA backend: ") + what + " needs CUDA, but flashattn was built without CUDA (FLASHATTN_CUDA=OFF)");
}
}  // namespace

bool available() { return false; }
bool supports(DType /*dtype*/, int /*head_dim*/) { return false; }
DeviceProperties device_properties(int /*device_index*/, DType /*dtype*/, int /*head_dim*/, bool /*paged*/) {
  refuse("planning for a device");
}
void run_attention(const AttnParams& /*params*/, const KernelChoice& /*choice*/, void* /*stream*/) {
  refuse("attention");
}
void run_append(const AppendParams& /*params*/, bool /*programmatic_launch*/, void* /*stream*/) {
  refuse("kv-cache append");
}
ScratchLease acquire_scratch(size_t /*bytes*/, void* /*stream*/, int /*device_index*/) {
  refuse("device allocation");
}
void release_scratch(const ScratchLease& lease, void* /*stream*/) {
  if (lease.ptr != nullptr) refuse("device release");
}
std::string compiled_instances() { return "none (built without CUDA)"; }
DeviceStatus* device_status(int /*device_index*/) { refuse("the device status word"); }
int current_device() { return 0; }
bool take_index_fault(void* /*stream*/, int /*device_index*/, IndexFault& /*fault*/) { return false; }  // no kernels ran
void copy_padded(const PaddedCopy& /*copy*/, void* /*stream*/) { refuse("staging copy"); }
void* allocate_async(size_t /*bytes*/, void* /*stream*/, int /*device_index*/) { refuse("device allocation"); }
void free_async(void* ptr, void* /*stream*/, int /*device_index*/) {
  if (ptr != nullptr) refuse("device release");
}

}  // namespace cuda
}  // namespace flashattn
