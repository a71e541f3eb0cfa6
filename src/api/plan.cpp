#include "api/plan.h"

#include <algorithm>
#include <thread>

#include "api/backend.h"
#include "common/tuning.h"

namespace flashattn {

namespace {
size_t align_up(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
}  // namespace

Workspace workspace_layout(const Problem& p, int num_splits) {
  Workspace w;
  size_t offset = 0;
  if (num_splits > 1) {
    const size_t rows = size_t(num_splits) * p.batch * p.heads * p.seqlen_q;
    w.o_accum_offset = offset;
    offset = align_up(offset + rows * p.head_dim * sizeof(float));
    w.lse_accum_offset = offset;
    offset = align_up(offset + rows * sizeof(float));
  }
  if (p.rotary_dim > 0) {
    w.q_rot_offset = offset;
    offset = align_up(offset + size_t(p.batch) * p.seqlen_q * p.heads * p.head_dim * dtype_size(p.dtype));
  }
  w.bytes = offset;
  return w;
}

DeviceFacts device_facts(const Problem& p, int num_threads) {
  DeviceFacts d;
  d.device = p.device;
  if (p.device == Device::cpu) {
    d.processors = num_threads > 0 ? num_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    return d;
  }
  const cuda::DeviceProperties props = cuda::device_properties(p.device_index, p.dtype, p.head_dim, p.paged);
  d.sms = props.sms;
  d.processors = kCtasPerSm * props.sms;  // D-15
  d.sm90 = props.sm90;
  d.served_head_dim = props.served_head_dim;
  d.splitkeys_slots = props.splitkeys_slots;
  d.persistent_slots = props.persistent_slots;
  d.heads_slots = props.heads_slots;
  return d;
}

const KernelOverride& override_of(const AttentionOptions& options) {
  return options.kernel_override ? *options.kernel_override : kernel_override_from_env();
}

Plan CallPlan::summary() const {
  Plan plan;
  plan.num_splits = choice.num_splits;
  plan.pack_gqa = choice.pack_gqa;
  plan.workspace_bytes = workspace_bytes;
  plan.deep_decode = choice.deep_pipeline;
  plan.kernel = choice.kernel;
  return plan;
}

CallPlan make_plan(const Problem& p, const AttentionOptions& options, int requested_splits) {
  CallPlan plan;
  plan.choice = choose_kernel(p, options, requested_splits, device_facts(p, options.num_threads), override_of(options));
  plan.workspace_bytes = workspace_layout(p, plan.choice.num_splits).bytes;
  return plan;
}

}  // namespace flashattn
