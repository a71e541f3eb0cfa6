#include <string>

#include "api/backend.h"
#include "flashattn/flashattn.h"

#ifndef FLASHATTN_VERSION
#define FLASHATTN_VERSION "0.1.0"
#endif

namespace flashattn {

bool cuda_available() { return cuda::available(); }

std::string build_info() {
  std::string s = "flashattn " FLASHATTN_VERSION "; backends: cpu";
#if defined(FLASHATTN_WITH_CUDA)
  s += ", cuda (kernels: " + cuda::compiled_instances() + ")";
#else
  s += " (built without CUDA)";
#endif
  return s;
}

}  // namespace flashattn
