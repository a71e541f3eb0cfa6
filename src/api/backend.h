// The two backends behind the API. The API layer validates, plans and fills AttnParams /
// AppendParams; a backend runs them as given (it never re-validates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/kernel_choice.h"
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
bool supports(DType dtype, int head_dim);  // an instance is compiled for this case

// CTAs of an instance's decode kernels resident at once on a device (0: not compiled for it).
struct DecodeSlots {
  int64_t splitkeys = 0;   // the keys-split kernel on the standard pipeline
  int64_t persistent = 0;  // the persistent grid's kernel
  int64_t heads = 0;       // the heads-split kernel (contiguous K/V only)
};
// What the kernel choice needs of a device (api/plan.cpp device_facts), cached per device.
struct DeviceProperties {
  int sms = 0;
  bool sm90 = false;          // compute capability 9.0, and the sm_90a kernels compiled in
  int served_head_dim = 0;    // the smallest compiled instance >= head_dim (0: none)
  int64_t splitkeys_slots = 0, persistent_slots = 0, heads_slots = 0;  // of that instance, for the layout
};
DeviceProperties device_properties(int device_index, DType dtype, int head_dim, bool paged);

// Runs the chosen kernel (api/kernel_choice.h) of the instance serving params.head_dim.
void run_attention(const AttnParams& params, const KernelChoice& choice, void* stream);
void run_append(const AppendParams& params, bool programmatic_launch, void* stream);
// Index faults (common/index_faults.h, cuda/backend.cu): the status word of a device, where its
// kernels record the first fault (AttnParams::status, AppendParams::status), and its reading:
// take_index_fault waits for `stream` (nullptr: the whole device), then reads the device's word,
// clears it and returns whether it held a fault (into `fault`).
DeviceStatus* device_status(int device_index);
int current_device();
bool take_index_fault(void* stream, int device_index, IndexFault& fault);
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
