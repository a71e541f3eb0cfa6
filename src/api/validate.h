// Validation of every public call: each rule once, each failure one flashattn::Error whose
// message is "<argument>: <rule> (got <value seen>)". Nothing runs before validation passes.
#pragma once

#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

// What validation learned about a call; planning and parameter filling read it.
struct Problem {
  Device device = Device::cpu;
  int device_index = 0;
  DType dtype = DType::bf16;
  int batch = 0;
  int seqlen_q = 0;   // dense/kvcache: sq; varlen: max_seqlen_q
  int seqlen_k = 0;   // dense: sk; varlen: max_seqlen_k; kvcache: cache capacity per row
  int heads = 0;
  int heads_k = 0;
  int head_dim = 0;
  bool varlen = false;
  bool kvcache = false;
  bool paged = false;
  int page_size = 0;
  int seqlen_new = 0;  // kvcache: rows of k_new
  int rotary_dim = 0;  // kvcache: 2 * rotary_cos.shape[1], 0 without rotary
  // Dense CUDA call whose q, k and v TMA can describe (kernel_choice.h tma_describable), set
  // from the kernel's params just before planning.
  bool tma_describable = false;
  // q or k/v stored as e4m3 (DType::e4m3): the kernels that read FP8 serve it (kernel_choice.cpp).
  bool fp8 = false;
  // q, k and v all e4m3: FP8 products can serve it (kernel_choice.cpp, D-75).
  bool fp8_qkv = false;
};

Problem validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const AttentionOptions& options);
Problem validate_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const VarlenArgs& args, const AttentionOptions& options);
Problem validate_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& out, const KVCacheArgs& args,
                         const AttentionOptions& options);
// The same rules for plan_kvcache, which has no output.
Problem validate_kvcache_plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const KVCacheArgs& args, const AttentionOptions& options);

// The workspace given to forward_kvcache, checked against what the plan needs; the bytes the
// call uses share no memory with the call's other arguments.
void validate_workspace(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& out, const KVCacheArgs& args,
                        const AttentionOptions& options, size_t needed_bytes);

// Rotary position of query i: cache_seqlens[b] + i when causal or local, else cache_seqlens[b]
// for every query (FlashAttention-2's rule).
bool rotary_q_per_row(const AttentionOptions& options);

std::string shape_string(const Tensor& t);  // "(2, 128, 8, 64)"

}  // namespace flashattn
