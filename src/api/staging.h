// Staging: any head dim and any strides on CUDA, outside the kernels.
//
// The CUDA kernels move fp16/bf16 rows in 16-byte pieces (e4m3 rows in 8-byte ones): they need
// the head dim a multiple of 8, every stride (but the last, 1) a multiple of 8 elements and the
// data aligned to 8 elements (16 bytes at most). A
// tensor that is not so is staged, the way FlashAttention-2 pads: copied on the device into
// scratch whose head dim is rounded up to a multiple of 8, the extra columns zero (so q·k is
// unchanged and the extra output columns are dropped), and an output is copied back. The
// softmax scale stays 1/sqrt(real head dim). Costs: docs/DECISIONS.md D-45.
#pragma once

#include <utility>
#include <vector>

#include "api/validate.h"

namespace flashattn {

constexpr int kCudaHeadDimMultiple = 8;  // 16-byte pieces of 2-byte elements, 8-byte ones of e4m3
constexpr int kCudaAlignmentBytes = 16;

// head_dim rounded up to a multiple of kCudaHeadDimMultiple.
int padded_head_dim(int head_dim);
// The head dim the CUDA kernels run at: padded_head_dim (CPU: the head dim, unless
// FLASHATTN_KERNEL=automatic,stage=cpu).
int kernel_head_dim(const Problem& p);
// The problem as the kernels run it (kernel_head_dim); planning and workspace use it.
Problem kernel_problem(const Problem& p);

// Whether the CUDA kernels can address t where it is: its last dim a multiple of 8, its data
// and its strides (of dims larger than 1) aligned to 16 bytes (8 bytes for e4m3: the kernels
// read e4m3 rows in 8-byte pieces, tile_loads.h copy_chunk). Always true on
// the CPU (unless FLASHATTN_KERNEL=automatic,stage=cpu, a test switch: the CPU is then staged by the same
// rule, with host copies, so that the CPU sweeps test the staging).
bool kernel_ready(const Tensor& t);

// The staged tensors of one call. Copies and allocations are queued on the call's stream;
// the memory is given back (stream-ordered) when the Staging ends.
class Staging {
 public:
  Staging(const Problem& p, void* stream);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // t itself when kernel_ready, else a zero-padded copy of it (the copy is queued now).
  Tensor input(const Tensor& t);
  // t itself when kernel_ready, else padded scratch that finish() copies back into t.
  Tensor output(const Tensor& t);
  // Copies the staged outputs' real columns back into the caller's tensors.
  void finish();

 private:
  Tensor allocate_like(const Tensor& t);
  void copy(const Tensor& src, const Tensor& dst);

  int head_dim_;
  Device device_;
  int device_index_;
  void* stream_;
  std::vector<void*> allocations_;
  std::vector<std::pair<Tensor, Tensor>> outputs_;  // (caller's, staged)
};

}  // namespace flashattn
