// Splitting a custom call's work over XLA:CPU's intra-op thread pool (shared by jaxgrpo's CPU kernels).
#ifndef JAXGRPO_MODELS_CPU_PARALLEL_H_
#define JAXGRPO_MODELS_CPU_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace jaxgrpo {

// Runs body(begin, end) over [0, count) cut into contiguous ranges, one per thread that takes part (at
// most the pool's thread count), on the calling thread and on the pool's threads, and returns when all
// have run. Every participant claims ranges from one counter, the caller included, so the caller only
// ever waits for ranges that are running: XLA may run several custom calls at once on the pool's
// threads, and a caller that waited for a task still queued behind them would wait forever. Tasks that
// start after every range is claimed return at once; they share the counter's ownership, so they never
// touch this call's stack after it returned.
template <typename Body>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t count, const Body& body) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), count));
  struct Counter {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto counter = std::make_shared<Counter>();
  auto work = [counter, count, parts, &body] {
    for (int64_t part; (part = counter->next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
      body(count * part / parts, count * (part + 1) / parts);
      counter->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t helper = 1; helper < parts; ++helper) pool.Schedule([work] { work(); });
  work();
  for (int spins = 0; counter->done.load(std::memory_order_acquire) < parts;) {
#if defined(__x86_64__)
    if (spins < 4096) {
      ++spins;
      _mm_pause();
      continue;
    }
#endif
    std::this_thread::yield();
  }
}

}  // namespace jaxgrpo

#endif  // JAXGRPO_MODELS_CPU_PARALLEL_H_
