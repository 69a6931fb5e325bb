// The kernels' parallel loops: at::parallel_for (OpenMP), except inside a fused decode step
// stepped where OpenMP is throttled, which runs them on a pool of its own threads that spin
// between loops.
//
// NOTE: why a pool of our own: libgomp spins only about 100 iterations before a thread sleeps
// on a futex when it counts more threads in its teams than the process has CPUs, and a team
// lives as long as the thread that started it. An engine built on one thread (its model load
// runs teams there) and stepped on another kept the process over the count: each of a decode
// step's ~200 parallel loops then waited for its threads to wake, decode batch 1 at half the
// main thread's speed (`python -m bench engine --step-thread --before openmp`:
// docs/notes/2026-11-26-amx-xeon.md, "Decode steps off the main thread"). The services now build and step
// on one thread (shared/engine/engine_thread.py), where OpenMP is not throttled and the pool
// stays idle (decode_stack.cpp: pool()); it still serves an engine stepped anywhere else.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KV_PAUSE() _mm_pause()
#else
#define KV_PAUSE() ((void)0)
#endif

namespace kernels {

// threads - 1 workers and the caller split each loop; between loops the workers spin for
// kSpin, then sleep until the next one.
class SpinPool {
 public:
  static constexpr std::chrono::microseconds kSpin{200};

  explicit SpinPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  SpinPool(const SpinPool&) = delete;
  SpinPool& operator=(const SpinPool&) = delete;
  ~SpinPool() {
    stop_.store(true);
    { std::lock_guard<std::mutex> lock(mutex_); }
    wake_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // f(chunk_begin, chunk_end) over [begin, end) in at most threads() chunks of at least
  // `grain`, as at::parallel_for splits it; returns when every chunk is done.
  template <class F>
  void run(int64_t begin, int64_t end, int64_t grain, const F& f) {
    const int64_t range = end - begin;
    if (range <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    const int64_t used = std::min<int64_t>(threads(), (range + grain - 1) / grain);
    if (used <= 1 || running_) return f(begin, end);  // running_: a loop inside a loop
    running_ = true;
    // NOTE: the loop's body as a pointer and a plain function, not a std::function: a step
    // runs some 200 loops, and this keeps each free of an allocation.
    task_ = {&f, [](const void* body, int64_t b, int64_t e) {
               (*static_cast<const F*>(body))(b, e);
             }};
    begin_ = begin, end_ = end, chunk_ = (range + used - 1) / used, chunks_ = used;
    error_ = nullptr;
    remaining_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lock(mutex_); }
      wake_.notify_all();
    }
    guarded(0);
    while (remaining_.load(std::memory_order_acquire) != 0) KV_PAUSE();
    running_ = false;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int index) {
    uint64_t seen = 0;
    while (true) {
      const uint64_t generation = next(seen);
      if (stop_.load()) return;
      seen = generation;
      if (index < chunks_) guarded(index);
      remaining_.fetch_sub(1, std::memory_order_release);
    }
  }

  // The next loop's generation: spin for kSpin, then sleep until it comes (or stop).
  uint64_t next(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int spins = 0;; ++spins) {
      const uint64_t generation = generation_.load(std::memory_order_acquire);
      if (generation != seen || stop_.load(std::memory_order_relaxed)) return generation;
      KV_PAUSE();
      if (spins % 256 == 255 && std::chrono::steady_clock::now() > until) break;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_.fetch_add(1);
    wake_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
    sleepers_.fetch_sub(1);
    return generation_.load();
  }

  // Chunk `index` of the loop that run() published.
  void guarded(int64_t index) {
    const int64_t b = begin_ + index * chunk_, e = std::min(end_, b + chunk_);
    if (b >= e) return;
    try {
      task_.call(task_.body, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  struct Task {
    const void* body;
    void (*call)(const void* body, int64_t begin, int64_t end);
  };

  std::vector<std::thread> workers_;
  Task task_{nullptr, nullptr};  // the loop run() published, and its range in chunks:
  int64_t begin_ = 0, end_ = 0, chunk_ = 0, chunks_ = 0;
  bool running_ = false;  // the calling thread's only
  std::exception_ptr error_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

// The pool this thread's kernels run their loops on (set for a fused decode step), or none.
inline thread_local SpinPool* active_pool = nullptr;
// Whether fused decode steps use their pool (kernels.use_step_pool: a benchmark's "before").
inline std::atomic<bool> step_pool_enabled{true};

// Sets `pool` as this thread's for a scope.
class UsePool {
 public:
  explicit UsePool(SpinPool* pool) : previous_(active_pool) { active_pool = pool; }
  ~UsePool() { active_pool = previous_; }

 private:
  SpinPool* previous_;
};

// The threads parallel_for splits a loop over here.
inline int num_threads() {
  return active_pool != nullptr ? active_pool->threads() : at::get_num_threads();
}

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (active_pool != nullptr) return active_pool->run(begin, end, grain, f);
  at::parallel_for(begin, end, grain, f);
}

}  // namespace kernels
