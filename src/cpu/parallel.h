// A minimal parallel loop for the CPU backend: the caller and helper threads pull item indices
// from an atomic counter (dynamic scheduling, since attention tiles differ in cost under masks).
// The helpers are kept between calls in one process-wide pool (docs/DECISIONS.md D-73).
//
// Helper threads come from one process-wide budget of hardware_concurrency() threads, counting
// every call in progress (its calling thread included): calls made from several threads at once
// share the cores instead of each starting a full set, so the process never runs more
// threads than cores beyond its own calling threads.
#pragma once

#include <cstdint>
#include <functional>

namespace flashattn {
namespace cpu {

// Threads a loop of `items` work items asks for: requested (0 = hardware threads), at least 1,
// at most `items`.
int resolve_threads(int requested, int64_t items);

// Runs body(item, worker) for item in [0, items) on up to `workers` threads (the caller is
// worker 0; fewer run while other calls hold the budget); worker < workers always. The first
// exception thrown by a body is rethrown here after all workers stopped. A helper thread that
// cannot be started throws flashattn::Error (runtime) before any item runs.
void parallel_for(int64_t items, int workers, const std::function<void(int64_t, int)>& body);

}  // namespace cpu
}  // namespace flashattn
