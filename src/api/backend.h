// The two backends behind the API. The API layer validates, plans and fills AttnParams /
// AppendParams; a backend runs them as given (it never re-validates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/params.h"

namespace flashattn {

namespace cpu {
// Attention, including the split-KV partials and their combine when params.num_splits > 1.
// Needs params.o_accum / lse_accum to point at host scratch then.
void run_attention(const AttnParams& params);
// Append k_new/v_new into the cache and apply rotary to q (into q_rot) and the new keys.
void run_append(const AppendParams& params);
}  // namespace cpu

namespace cuda {
bool available();                 // compiled in and a device is visible
int num_sms(int device_index);    // multiprocessors of the device (for planning)
// SMs when the device runs the deep decode pipeline for this dtype and head dim (sm_90 code
// compiled, compute capability 9.x, the serving instance's head dim <= 128,
// FLASHATTN_NO_DEEP_DECODE unset), else 0 (for planning).
int deep_decode_sms(int device_index, DType dtype, int head_dim);
bool supports(DType dtype, int head_dim);  // an instance is compiled for this case
void run_attention(const AttnParams& params, void* stream);
void run_append(const AppendParams& params, void* stream);
// Scratch for a call that was not given a workspace: the stream's cached buffer (grown when a
// call needs more), held by this call until release_scratch so that no other host thread's
// call on the stream can grow it meanwhile; while the stream is being captured into a CUDA
// graph, memory allocated for this call and freed after it (stream-ordered).
struct ScratchLease {
  void* ptr = nullptr;
  void* stream_entry = nullptr;  // the stream's cache entry (locked), or null
};
ScratchLease acquire_scratch(size_t bytes, void* stream, int device_index);
void release_scratch(const ScratchLease& lease, void* stream);
std::string compiled_instances();  // "bf16: 64 128; fp16: 64 128" for build_info()

// Staging (src/api/staging.h, src/cuda/pad.cu): a strided copy of a 4-D array of 16-bit
// elements into another of the same outer shape (dims 0..2). Of the last dimension, the first
// min(src_cols, dst_cols) columns are copied and dst's columns from src_cols on are set to 0.
// Strides in elements. Queued on the stream; nothing is allocated.
struct PaddedCopy {
  int device_index = 0;
  int element_bytes = 2;
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t shape[3] = {0, 0, 0};
  int64_t src_stride[3] = {0, 0, 0};
  int64_t dst_stride[3] = {0, 0, 0};
  int src_cols = 0;
  int dst_cols = 0;
};
void copy_padded(const PaddedCopy& copy, void* stream);
// Stream-ordered device memory for staged tensors (the device's default pool; capturable).
void* allocate_async(size_t bytes, void* stream, int device_index);
void free_async(void* ptr, void* stream, int device_index);
}  // namespace cuda

}  // namespace flashattn
