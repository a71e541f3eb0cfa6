#include "cpu/parallel.h"

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

int resolve_threads(int requested, int64_t items) {
  int threads = requested > 0 ? requested : int(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  if (items < threads) threads = items < 1 ? 1 : int(items);
  return threads;
}

void parallel_for(int64_t items, int workers, const std::function<void(int64_t, int)>& body) {
  if (items <= 0) return;
  if (workers <= 1) {
    for (int64_t i = 0; i < items; ++i) body(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker_loop = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < items && !failed.load(); i = next.fetch_add(1)) {
        body(i, worker);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  std::string start_failure;
  for (int w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(worker_loop, w);
    } catch (const std::system_error& e) {
      // Out of threads (or of address space for their stacks): stop the workers started so
      // far, and report it, rather than leave joinable threads behind (std::terminate).
      start_failure = "CPU backend: could not start worker thread " + std::to_string(w) + " of " +
                      std::to_string(workers) + " (" + e.what() +
                      "); fewer threads (AttentionOptions::num_threads) may help";
      failed.store(true);
      break;
    }
  }
  if (start_failure.empty()) worker_loop(0);
  for (auto& t : threads) t.join();
  if (!start_failure.empty()) throw Error(Error::Kind::runtime, start_failure);
  if (error) std::rethrow_exception(error);
}

}  // namespace cpu
}  // namespace flashattn
