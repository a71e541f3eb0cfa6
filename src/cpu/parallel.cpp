#include "cpu/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

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

// One parallel_for call's loop, run by its caller (worker 0) and the helpers that took its
// tickets; it lives on the caller's stack until every ticket taken has finished.
struct Job {
  int64_t items = 0;
  const std::function<void(int64_t, int)>* body = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int> next_worker{1};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  int running = 0;  // tickets taken and not finished (guarded by the pool's mutex)

  void record(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = e;
    failed.store(true);
  }
  void work(int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < items && !failed.load(); i = next.fetch_add(1)) (*body)(i, worker);
    } catch (...) {
      record(std::current_exception());
    }
  }
};

// Helper threads kept between calls (docs/DECISIONS.md D-73): a call posts one ticket per helper it was granted;
// idle helpers spin for a short while before they sleep, so that calls in a row (decode steps)
// find them awake. Started on demand, never more than the budget's helpers; never stopped (a
// process that exits takes them with it).
class WorkerPool {
 public:
  // Runs job on the caller and `helpers` pool threads; returns once all that took part finished.
  void run(Job& job, int helpers) {
    start_threads(helpers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int h = 0; h < helpers; ++h) tickets_.push_back(&job);
      queued_.fetch_add(helpers);
    }
    for (int h = 0; h < helpers; ++h) work_ready_.notify_one();
    job.work(0);
    std::unique_lock<std::mutex> lock(mutex_);
    retract_tickets(job);  // the items ran out: helpers that did not start need not
    job_done_.wait(lock, [&] { return job.running == 0; });
  }

 private:
  static constexpr auto kSpin = std::chrono::microseconds(50);

  // Starts threads until `helpers` are available to each call; throws Error (runtime) if the
  // system refuses one (the threads started stay in the pool).
  void start_threads(int helpers) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int wanted = std::min(hardware_threads() - 1, threads_in_use.load() - 1);
    const int target = std::max(helpers, wanted);
    while (threads_ < target) {
      try {
        std::thread(&WorkerPool::serve, this).detach();
      } catch (const std::system_error& e) {
        throw Error(Error::Kind::runtime, "cpu backend: could not start worker thread " +
                                              std::to_string(threads_ + 1) + " of " + std::to_string(target) +
                                              ": " + e.what());
      }
      ++threads_;
    }
  }

  void retract_tickets(Job& job) {
    const auto kept = std::remove(tickets_.begin(), tickets_.end(), &job);
    queued_.fetch_sub(int(tickets_.end() - kept));
    tickets_.erase(kept, tickets_.end());
  }

  void serve() {
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      while (queued_.load(std::memory_order_relaxed) == 0 && std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
      }
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [&] { return !tickets_.empty(); });
        job = tickets_.front();
        tickets_.pop_front();
        queued_.fetch_sub(1);
        ++job->running;
      }
      job->work(job->next_worker.fetch_add(1));
      std::lock_guard<std::mutex> lock(mutex_);
      if (--job->running == 0) job_done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_ready_, job_done_;
  std::deque<Job*> tickets_;
  std::atomic<int> queued_{0};  // tickets_.size(), read without the lock by spinning helpers
  int threads_ = 0;
};

// The process's pool. A forked child has none of its parent's threads: it starts a new pool (the
// parent's state, its mutex possibly held at the fork, is left behind) and a new budget.
WorkerPool* pool_instance = nullptr;
std::once_flag pool_once;

void forget_pool_in_child() {
  pool_instance = new WorkerPool;
  threads_in_use.store(0);
}

WorkerPool& pool() {
  std::call_once(pool_once, [] {
    pool_instance = new WorkerPool;
    pthread_atfork(nullptr, nullptr, forget_pool_in_child);
  });
  return *pool_instance;
}

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
  Job job;
  job.items = items;
  job.body = &body;
  pool().run(job, helpers);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace cpu
}  // namespace flashattn
