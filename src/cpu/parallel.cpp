#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {
namespace {

int hardware_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

// Threads of calls in progress, calling threads included (see parallel.h).
std::atomic<int> threads_in_use{0};

// Takes the calling thread and up to `wanted` helpers from the budget; returns the helpers
// granted (0 when the budget is spent: the caller then works alone).
int take_helpers(int wanted) {
  const int budget = hardware_threads();
  int in_use = threads_in_use.load();
  for (;;) {
    const int helpers = std::max(0, std::min(wanted, budget - in_use - 1));
    if (threads_in_use.compare_exchange_weak(in_use, in_use + 1 + helpers)) return helpers;
  }
}

// Gives back what take_helpers granted, whatever way the call ends.
struct BudgetLease {
  int threads;
  ~BudgetLease() { threads_in_use.fetch_sub(threads); }
};

}  // namespace

int resolve_threads(int requested, int64_t items) {
  int threads = requested > 0 ? requested : hardware_threads();
  if (items < threads) threads = items < 1 ? 1 : int(items);
  return threads;
}

void parallel_for(int64_t items, int workers, const std::function<void(int64_t, int)>& body) {
  if (items <= 0) return;
  const int helpers = workers > 1 ? take_helpers(workers - 1) : 0;
  const BudgetLease lease{workers > 1 ? 1 + helpers : 0};
  if (helpers == 0) {
    for (int64_t i = 0; i < items; ++i) body(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto record = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = e;
    failed.store(true);
  };
  auto worker_loop = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < items && !failed.load(); i = next.fetch_add(1)) {
        body(i, worker);
      }
    } catch (...) {
      record(std::current_exception());
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(helpers);
  for (int w = 1; w <= helpers && !failed.load(); ++w) {
    try {
      threads.emplace_back(worker_loop, w);
    } catch (const std::system_error& e) {
      record(std::make_exception_ptr(
          Error(Error::Kind::runtime, "cpu backend: could not start worker thread " + std::to_string(w) +
                                          " of " + std::to_string(helpers) + ": " + e.what())));
    }
  }
  worker_loop(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace cpu
}  // namespace flashattn
