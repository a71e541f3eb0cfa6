// Index faults: a length or an index that a kernel reads from memory (cu_seqlens, seqused_k,
// cache_seqlens, cache_leftpad, cache_batch_idx, block_table) and that lies outside the range
// the kernel may address. The host checks these values where it can read them (api/validate.cpp,
// the CPU backend); on the GPU that would need a synchronisation, so each kernel checks a value
// as it reads it (rules.h seq_info_read for the lengths, the page lookups for block_table) and
// records the first fault of the device in a DeviceStatus, which check_device_status() reads
// (docs/DECISIONS.md D-61).
#pragma once

#include <cstdint>

namespace flashattn {

// Which argument a fault is in. seqused_k and leftpad_k of a forward_kvcache call are its
// cache_seqlens and cache_leftpad (AttnParams::kv_cache picks the name).
enum class IndexArg : int32_t {
  none = 0,
  cu_seqlens_q,
  cu_seqlens_k,
  seqused_k,
  leftpad_k,
  cache_seqlens,
  cache_leftpad,
  cache_batch_idx,
  block_table,
};

// A value read at sequence `batch` that lies outside [lo, hi].
struct IndexFault {
  int32_t arg;  // IndexArg
  int32_t batch;
  int32_t value;
  int32_t lo, hi;
};

// The device's status word: `claimed` goes 0 -> 1 once (atomicCAS), and the thread that claimed
// it writes `first`, so that only the first fault is kept. Read and cleared by the host after a
// synchronisation (cuda/device_status.cu).
struct DeviceStatus {
  int32_t claimed;
  IndexFault first;
};

inline const char* index_arg_name(IndexArg arg) {
  switch (arg) {
    case IndexArg::cu_seqlens_q: return "cu_seqlens_q";
    case IndexArg::cu_seqlens_k: return "cu_seqlens_k";
    case IndexArg::seqused_k: return "seqused_k";
    case IndexArg::leftpad_k: return "leftpad_k";
    case IndexArg::cache_seqlens: return "cache_seqlens";
    case IndexArg::cache_leftpad: return "cache_leftpad";
    case IndexArg::cache_batch_idx: return "cache_batch_idx";
    case IndexArg::block_table: return "block_table";
    default: return "an index argument";
  }
}

}  // namespace flashattn
