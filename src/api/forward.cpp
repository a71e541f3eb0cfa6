// The public entry points: validate -> plan -> fill parameters -> run on a backend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "api/backend.h"
#include "api/plan.h"
#include "api/staging.h"
#include "api/validate.h"
#include "common/params.h"

namespace flashattn {

namespace {

// ---- scratch memory --------------------------------------------------------------------------

// Scratch for one call: the caller's workspace, the CUDA backend's scratch for the call's
// stream (cuda::acquire_scratch, released when the call is done), or host memory owned here.
class Scratch {
 public:
  Scratch(const Problem& p, size_t bytes, void* given, void* stream) : stream_(stream) {
    if (bytes == 0) return;
    if (given) {
      base_ = static_cast<char*>(given);
    } else if (p.device == Device::cuda) {
      lease_ = cuda::acquire_scratch(bytes, stream, p.device_index);
      base_ = static_cast<char*>(lease_.ptr);
    } else {
      host_.reset(new char[bytes + kWorkspaceAlign]);
      const uintptr_t raw = reinterpret_cast<uintptr_t>(host_.get());
      base_ = reinterpret_cast<char*>((raw + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign);
    }
  }
  ~Scratch() { cuda::release_scratch(lease_, stream_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  char* at(size_t offset) const { return base_ + offset; }

 private:
  void* stream_;
  char* base_ = nullptr;
  cuda::ScratchLease lease_;
  std::unique_ptr<char[]> host_;
};

// ---- parameter filling -----------------------------------------------------------------------

const int* ints(const Tensor& t) { return t.defined() ? static_cast<const int*>(t.data) : nullptr; }

// Strides of a (rows, heads, d) view whose batch dimension, if any, comes first.
struct Strides3 {
  int64_t batch, row, head;
};
Strides3 strides_of(const Tensor& t) {
  if (t.ndim == 4) return {t.stride[0], t.stride[1], t.stride[2]};
  return {0, t.stride[0], t.stride[1]};  // varlen: (total, heads, d)
}

// A window side that reaches past every key a query could see is unbounded: left >= seqlen_k
// or right >= seqlen_q (the longest sequences; validation keeps seqlen_q + seqlen_k below 2^31),
// so that the mask's int32 positions (rules.h visible_keys) cannot overflow.
int window_side(int side, int reach) { return side >= reach ? -1 : side; }

void set_options(AttnParams& a, const Problem& p, const AttentionOptions& o) {
  a.softmax_scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(float(p.head_dim));
  a.softcap = o.softcap;
  a.window_left = window_side(o.window_left, p.seqlen_k);
  a.window_right = o.causal ? 0 : window_side(o.window_right, p.seqlen_q);  // causal = a window with right side 0
  if (o.alibi_slopes.defined()) {
    a.alibi_slopes = static_cast<const float*>(o.alibi_slopes.data);
    a.alibi_batch_stride = o.alibi_slopes.ndim == 2 ? o.alibi_slopes.stride[0] : 0;
  }
  if (o.softmax_lse.defined()) {
    const Tensor& l = o.softmax_lse;
    a.lse = static_cast<float*>(l.data);
    a.lse_batch_stride = p.varlen ? 0 : l.stride[0];
    a.lse_head_stride = p.varlen ? l.stride[0] : l.stride[1];
  }
  a.num_threads = o.num_threads;
}

// An FP8 descale factor (AttentionOptions) into the params' pointer and (batch, KV head)
// strides: both strides 0 for a scalar; null when not given.
void set_descale(const Tensor& t, const float*& data, int64_t& batch_stride, int64_t& head_stride) {
  if (!t.defined()) return;
  data = static_cast<const float*>(t.data);
  batch_stride = t.ndim == 2 ? t.stride[0] : 0;
  head_stride = t.ndim == 2 ? t.stride[1] : 0;
}

void set_descales(AttnParams& a, const AttentionOptions& o) {
  set_descale(o.q_descale, a.q_descale, a.q_descale_batch_stride, a.q_descale_head_stride);
  set_descale(o.k_descale, a.k_descale, a.k_descale_batch_stride, a.k_descale_head_stride);
  set_descale(o.v_descale, a.v_descale, a.v_descale_batch_stride, a.v_descale_head_stride);
}

// Where a CUDA call's kernels record an index fault; the CPU backend gets none (the host checked
// the values it reads).
DeviceStatus* status_word(const Problem& p) {
  return p.device == Device::cuda ? cuda::device_status(p.device_index) : nullptr;
}

AttnParams make_params(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const AttentionOptions& o) {
  AttnParams a;
  a.dtype = p.dtype;
  a.q_storage = q.dtype;
  a.kv_storage = k.dtype;
  a.device_index = p.device_index;
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.o = out.data;
  const Strides3 sq = strides_of(q), sk = strides_of(k), sv = strides_of(v), so = strides_of(out);
  a.q_batch_stride = sq.batch, a.q_row_stride = sq.row, a.q_head_stride = sq.head;
  a.k_batch_stride = sk.batch, a.k_row_stride = sk.row, a.k_head_stride = sk.head;
  a.v_batch_stride = sv.batch, a.v_row_stride = sv.row, a.v_head_stride = sv.head;
  a.o_batch_stride = so.batch, a.o_row_stride = so.row, a.o_head_stride = so.head;
  a.batch = p.batch;
  a.num_heads = p.heads;
  a.num_heads_k = p.heads_k;
  // The kernels' head dim: with a head dim that is not a multiple of 8 on cuda, q, k, v and out
  // are all staged copies of that width (staging.h); the scale stays the real head dim's.
  a.head_dim = kernel_head_dim(p);
  a.seqlen_q = p.seqlen_q;
  a.seqlen_k = p.seqlen_k;
  // Bounds of the index values the kernels read (rules.h seq_info_read); varlen q and k are
  // (total, heads, d).
  a.total_q = q.ndim == 3 ? int(q.shape[0]) : 0;
  a.total_k = k.ndim == 3 ? int(k.shape[0]) : 0;
  a.key_capacity = p.seqlen_k;
  a.status = status_word(p);
  set_options(a, p, o);
  set_descales(a, o);
  return a;
}

// cache: the paged K/V tensor (num_pages, page_size, hk, d), whose pages bound the entries.
void set_paging(AttnParams& a, const Tensor& block_table, int page_size, const Tensor& cache) {
  if (!block_table.defined()) return;
  a.block_table = ints(block_table);
  a.block_table_batch_stride = block_table.stride[0];
  a.block_table_pages = int(block_table.shape[1]);
  a.page_size = page_size;
  a.num_pages = int(cache.shape[0]);
  a.key_capacity = int(std::min<int64_t>(block_table.shape[1] * int64_t(page_size), INT32_MAX));
}

// ---- index faults (common/index_faults.h) ------------------------------------------------------

// The checked mode: the option, or FLASHATTN_KERNEL=...,checked=on for every call.
bool checked_mode(const AttentionOptions& o) { return o.checked || kernel_override_from_env().checked; }

// The message of a fault the kernels recorded: the argument, the sequence, the value, its range.
std::string describe_fault(const IndexFault& f) {
  const IndexArg arg = static_cast<IndexArg>(f.arg);
  std::string message = std::string(index_arg_name(arg)) + ": a value read on the device at sequence " +
                        std::to_string(f.batch) + " is out of range: " + std::to_string(f.value) + " not in [" +
                        std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]";
  message += arg == IndexArg::block_table
                 ? " (a page index of the cache; the keys on that page were read as zeros)"
                 : arg == IndexArg::cu_seqlens_q ? " (that sequence's rows were not computed)"
                                                 : " (that sequence ran with no keys: output 0, LSE -inf)";
  return message + "; recorded by the kernels since the last check_device_status";
}

void throw_index_fault(void* stream, int device_index) {
  IndexFault fault{};
  if (cuda::take_index_fault(stream, device_index, fault)) {
    throw Error(Error::Kind::invalid_argument, describe_fault(fault));
  }
}

// A CUDA call in the checked mode: waits for its launches and throws the first fault.
void check_call(const Problem& p, const AttentionOptions& o) {
  if (p.device == Device::cuda && checked_mode(o)) throw_index_fault(o.stream, p.device_index);
}

// ---- running ---------------------------------------------------------------------------------

bool nothing_to_do(const Problem& p) { return p.batch == 0 || p.seqlen_q == 0; }

// Splits (with the scratch they need) and GQA packing, then the backend. kp: the problem as the
// kernels run it (kernel_problem).
void run_attention(const Problem& kp, AttnParams& a, const KernelChoice& choice, const Scratch& scratch,
                   void* stream) {
  a.pack_gqa = choice.pack_gqa;
  a.num_splits = choice.num_splits;
  a.deep_decode = choice.deep_pipeline;
  if (choice.num_splits > 1) {
    const Workspace w = workspace_layout(kp, choice.num_splits);
    a.o_accum = reinterpret_cast<float*>(scratch.at(w.o_accum_offset));
    a.lse_accum = reinterpret_cast<float*>(scratch.at(w.lse_accum_offset));
  }
  if (kp.device == Device::cuda) {
    cuda::run_attention(a, choice, stream);
  } else {
    cpu::run_attention(a);
  }
}

void run_planned(const Problem& p, AttnParams& a, const AttentionOptions& o) {
  Problem kp = kernel_problem(p);
  kp.tma_describable = kp.device == Device::cuda && tma_describable(a);
  const CallPlan plan = make_plan(kp, o, 0);
  Scratch scratch(kp, plan.workspace_bytes, nullptr, o.stream);
  run_attention(kp, a, plan.choice, scratch, o.stream);
}

// ---- kv cache: append ------------------------------------------------------------------------

AppendParams make_append_params(const Problem& p, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, const KVCacheArgs& args,
                                const AttentionOptions& o) {
  AppendParams ap;
  ap.dtype = p.dtype;
  ap.device_index = p.device_index;
  ap.batch = p.batch;
  ap.num_heads = p.heads;
  ap.num_heads_k = p.heads_k;
  ap.head_dim = p.head_dim;
  ap.seqlen_q = p.seqlen_q;
  ap.seqlen_new = p.seqlen_new;
  ap.cache_seqlens = ints(args.cache_seqlens);
  ap.cache_batch_idx = ints(args.cache_batch_idx);
  ap.capacity = p.seqlen_k;
  ap.cache_batches = int(k_cache.shape[0]);
  ap.status = status_word(p);
  if (args.block_table.defined()) {
    ap.block_table = ints(args.block_table);
    ap.block_table_batch_stride = args.block_table.stride[0];
    ap.page_size = p.page_size;
    ap.num_pages = int(k_cache.shape[0]);
  }
  ap.cache_storage = k_cache.dtype;
  set_descale(o.k_descale, ap.k_descale, ap.k_descale_batch_stride, ap.k_descale_head_stride);
  set_descale(o.v_descale, ap.v_descale, ap.v_descale_batch_stride, ap.v_descale_head_stride);
  ap.k_cache = k_cache.data;
  ap.v_cache = v_cache.data;
  ap.kc_batch_stride = k_cache.stride[0], ap.kc_row_stride = k_cache.stride[1], ap.kc_head_stride = k_cache.stride[2];
  ap.vc_batch_stride = v_cache.stride[0], ap.vc_row_stride = v_cache.stride[1], ap.vc_head_stride = v_cache.stride[2];
  if (p.seqlen_new > 0) {
    ap.k_new = args.k_new.data;
    ap.v_new = args.v_new.data;
    ap.kn_batch_stride = args.k_new.stride[0], ap.kn_row_stride = args.k_new.stride[1], ap.kn_head_stride = args.k_new.stride[2];
    ap.vn_batch_stride = args.v_new.stride[0], ap.vn_row_stride = args.v_new.stride[1], ap.vn_head_stride = args.v_new.stride[2];
  }
  if (p.rotary_dim > 0) {
    ap.rotary_cos = args.rotary_cos.data;
    ap.rotary_sin = args.rotary_sin.data;
    ap.rotary_row_stride = args.rotary_cos.stride[0];
    ap.rotary_dim = p.rotary_dim;
    ap.rotary_rows = int(args.rotary_cos.shape[0]);
    ap.rotary_interleaved = args.rotary_interleaved;
    ap.rotary_q_per_row = rotary_q_per_row(o);
  }
  ap.q = q.data;
  ap.q_batch_stride = q.stride[0], ap.q_row_stride = q.stride[1], ap.q_head_stride = q.stride[2];
  ap.num_threads = o.num_threads;
  return ap;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const AttentionOptions& options) {
  const Problem p = validate_forward(q, k, v, out, options);
  if (nothing_to_do(p)) return;
  Staging staged(p, options.stream);
  AttnParams a = make_params(p, staged.input(q), staged.input(k), staged.input(v), staged.output(out), options);
  run_planned(p, a, options);
  staged.finish();
  check_call(p, options);
}

void forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const VarlenArgs& args, const AttentionOptions& options) {
  const Problem p = validate_varlen(q, k, v, out, args, options);
  if (nothing_to_do(p)) return;
  Staging staged(p, options.stream);
  AttnParams a = make_params(p, staged.input(q), staged.input(k), staged.input(v), staged.output(out), options);
  a.cu_seqlens_q = ints(args.cu_seqlens_q);
  a.cu_seqlens_k = ints(args.cu_seqlens_k);
  a.seqused_k = ints(args.seqused_k);
  a.leftpad_k = ints(args.leftpad_k);
  set_paging(a, args.block_table, p.page_size, k);
  run_planned(p, a, options);
  staged.finish();
  check_call(p, options);
}

namespace {

// The params of a KV-cache call's attention over q and the caches (forward_kvcache's step 2).
AttnParams make_kvcache_params(const Problem& p, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const Tensor& out, const KVCacheArgs& args, const AttentionOptions& options) {
  AttnParams a = make_params(p, q, k_cache, v_cache, out, options);
  a.seqused_k = ints(args.cache_seqlens);
  a.seqused_k_added = p.seqlen_new;
  a.leftpad_k = ints(args.cache_leftpad);
  a.cache_batch_idx = ints(args.cache_batch_idx);
  a.cache_batches = int(k_cache.shape[0]);
  a.kv_cache = true;
  set_paging(a, args.block_table, p.page_size, k_cache);
  return a;
}

// A KV-cache call's kernel problem, with whether TMA can describe q and the caches as the caller
// gave them (the warpspec kernel's loads; out's strides do not matter, q stands in for it).
Problem kvcache_kernel_problem(const Problem& p, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const KVCacheArgs& args, const AttentionOptions& options) {
  Problem kp = kernel_problem(p);
  kp.tma_describable =
      kp.device == Device::cuda && tma_describable(make_kvcache_params(p, q, k_cache, v_cache, q, args, options));
  return kp;
}

}  // namespace

Plan plan_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                  const KVCacheArgs& args, const AttentionOptions& options) {
  const Problem p = validate_kvcache_plan(q, k_cache, v_cache, args, options);
  return make_plan(kvcache_kernel_problem(p, q, k_cache, v_cache, args, options), options, args.num_splits).summary();
}

void forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& out, const KVCacheArgs& args,
                     const AttentionOptions& options) {
  const Problem p = validate_kvcache(q, k_cache, v_cache, out, args, options);
  Problem kp = kvcache_kernel_problem(p, q, k_cache, v_cache, args, options);
  const CallPlan plan = make_plan(kp, options, args.num_splits);
  validate_workspace(q, k_cache, v_cache, out, args, options, plan.workspace_bytes);
  if (p.batch == 0) return;
  Scratch scratch(kp, plan.workspace_bytes, args.workspace, options.stream);

  // 1. append the new keys/values (rotated) into the caller's cache and rotate q, at the real
  // head dim: the append kernel takes any head dim and strides, so no staging is needed here
  // and nothing has to be written back into the cache afterwards.
  Tensor q_used = q;
  if (p.seqlen_new > 0 || p.rotary_dim > 0) {
    AppendParams ap = make_append_params(p, q, k_cache, v_cache, args, options);
    if (p.rotary_dim > 0) {
      ap.q_rot = scratch.at(workspace_layout(kp, plan.choice.num_splits).q_rot_offset);
      q_used = Tensor::contiguous(ap.q_rot, q.dtype, {q.shape[0], q.shape[1], q.shape[2], q.shape[3]},
                                  q.device, q.device_index);
    }
    if (p.device == Device::cuda) {
      cuda::run_append(ap, plan.choice.programmatic_launch, options.stream);
    } else {
      cpu::run_append(ap);
    }
  }
  if (p.seqlen_q == 0) return check_call(p, options);

  // 2. attend over the cache, through staged copies of what the kernels cannot read in place
  // (all of q, the caches and out when the head dim is not a multiple of 8 on cuda)
  Staging staged(p, options.stream);
  AttnParams a = make_kvcache_params(p, staged.input(q_used), staged.input(k_cache), staged.input(v_cache),
                                     staged.output(out), args, options);
  // The tensors the kernels read (a rotated q, staged copies) decide whether TMA describes them;
  // where that differs from the caller's tensors, the kernel is chosen again (the split count,
  // and so the workspace, are the same: only unsplit calls take the warpspec kernel).
  KernelChoice choice = plan.choice;
  const bool describable = kp.device == Device::cuda && tma_describable(a);
  if (describable != kp.tma_describable) {
    kp.tma_describable = describable;
    choice = make_plan(kp, options, args.num_splits).choice;
  }
  run_attention(kp, a, choice, scratch, options.stream);
  staged.finish();
  check_call(p, options);
}

void check_device_status(void* stream) {
  if (!cuda::available()) return;  // no kernels ran: nothing recorded
  throw_index_fault(stream, cuda::current_device());
}

}  // namespace flashattn
