// A minimal parallel loop for the CPU backend: std::thread workers pull item indices from an
// atomic counter (dynamic scheduling, since attention tiles differ in cost under masks).
#pragma once

#include <cstdint>
#include <functional>

namespace flashattn {
namespace cpu {

// Threads a loop of `items` work items will use: requested (0 = hardware threads), at least 1,
// at most `items`.
int resolve_threads(int requested, int64_t items);

// Runs body(item, worker) for item in [0, items) on `workers` threads (the caller is worker 0);
// `workers` should come from resolve_threads. The first exception thrown by a body is rethrown
// here after all workers stopped; a worker thread that cannot be started stops the others and
// throws flashattn::Error (runtime), some items possibly done.
void parallel_for(int64_t items, int workers, const std::function<void(int64_t, int)>& body);

}  // namespace cpu
}  // namespace flashattn
