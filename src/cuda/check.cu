// Error checks shared by every CUDA source: one message format for every failed call.
#include <string>

#include "cuda/launch.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cuda {

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw Error(Error::Kind::runtime, std::string(what) + ": " + cudaGetErrorString(err));
}

// A launch reports a bad configuration (grid, shared memory, missing image for this GPU) only
// through cudaGetLastError; errors inside the kernel surface at the next synchronising call.
void check_launch(const char* kernel_name) {
  check_cuda(cudaGetLastError(), (std::string("launch of ") + kernel_name).c_str());
}

}  // namespace cuda
}  // namespace flashattn
