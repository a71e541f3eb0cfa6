// Planning: the kernel choice of a validated call (api/kernel_choice.h) on its device, and the
// scratch it needs. Host functions of shapes, options and device facts.
#pragma once

#include <cstddef>

#include "api/kernel_choice.h"
#include "api/validate.h"

namespace flashattn {

constexpr size_t kWorkspaceAlign = 256;

struct Workspace {
  size_t o_accum_offset = 0, lse_accum_offset = 0, q_rot_offset = 0;
  size_t bytes = 0;
};

// Scratch layout for num_splits partials and (with rotary) the rotated q.
Workspace workspace_layout(const Problem& p, int num_splits);

// What the kernel choice needs of the call's device: CPU threads, or the CUDA device's SMs,
// architecture and the decode kernels' resident CTAs for the instance serving the head dim.
DeviceFacts device_facts(const Problem& p, int num_threads);

// The override a call runs with: its options' kernel_override, else FLASHATTN_KERNEL's.
const KernelOverride& override_of(const AttentionOptions& options);

struct CallPlan {
  KernelChoice choice;
  size_t workspace_bytes = 0;
  Plan summary() const;  // the public Plan
};

// requested_splits: 0 = heuristic.
CallPlan make_plan(const Problem& p, const AttentionOptions& options, int requested_splits);

}  // namespace flashattn
