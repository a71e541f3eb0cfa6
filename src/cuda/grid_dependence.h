// The device side of programmatic dependent launches (launch.h KernelLaunch::
// as_programmatic_dependent, may_launch_as_programmatic_dependent): on sm_90 and newer; no-ops
// in code compiled for older GPUs (which the host then never launches as a dependent).
#pragma once

namespace flashattn {
namespace cuda {

// Waits, in a kernel launched as a programmatic dependent, until the grid before it in the
// stream has finished and its writes are visible; returns at once in a kernel launched without
// that attribute. Nothing before it may read what that grid may write (Q, K/V appended in place,
// lengths, page tables) or write what it may read: the decode kernels and the append call it
// first, so what the launch gains is their CTAs resident and set up while that grid drains, not
// a read ahead of it. The combine reads the sequence lengths before it (combine.cu), which the
// grids it follows have made final (allow_dependent_launch).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the grid launched after this one as a programmatic dependent (the split-KV combine,
// combine.cu) be scheduled now: its blocks wait in griddepcontrol.wait until this grid has
// finished and its writes are visible, so the trigger can come first. Issued at the start (after
// the kernel's own wait_for_previous_grid, so that what the combine reads before its wait is
// final), the combine's blocks are resident before the last attention CTA ends, which takes
// their launch off a small decode call's critical path (docs/DECISIONS.md D-37).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace cuda
}  // namespace flashattn
