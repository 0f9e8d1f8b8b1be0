// Asynchronous replies. The coordinator's logic never blocks a thread on a waiting caller (a
// rendezvous, a barrier, a blocking store get): it keeps a Pending and completes it later, from
// whichever thread makes the condition true or from the timer that expires it.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dt {

// Run locks (the coordinator's per-run mutexes) this thread holds. The coordinator's rule is
// "decide under a lock, reply outside it": a reply's callback may finish a gRPC call, wake a
// watcher or call back into the coordinator, and under a run's lock it would stall every other
// call of the run, or deadlock. Builds with DT_CHECK_LOCK_RULE (debug and sanitizer builds) abort
// on the first reply completed under one.
inline thread_local int run_locks_held = 0;

inline void CheckNoRunLockHeld() {
#ifdef DT_CHECK_LOCK_RULE
  if (run_locks_held != 0) {
    std::fprintf(stderr, "dt: a reply was completed while this thread holds %d run lock(s)\n", run_locks_held);
    std::abort();
  }
#endif
}

// A reply that is delivered exactly once: by the logic, or by the transport when the caller
// cancels. Later attempts are ignored.
template <typename T>
class Pending {
 public:
  using Callback = std::function<void(absl::StatusOr<T>)>;
  explicit Pending(Callback callback) : callback_(std::move(callback)) {}

  // Returns false (and does nothing) if the reply was already delivered.
  bool Complete(absl::StatusOr<T> result) {
    CheckNoRunLockHeld();
    if (done_.exchange(true)) return false;
    Callback cb = std::move(callback_);
    callback_ = nullptr;
    cb(std::move(result));
    return true;
  }
  bool done() const { return done_.load(); }

 private:
  std::atomic<bool> done_{false};
  Callback callback_;
};

template <typename T>
using PendingPtr = std::shared_ptr<Pending<T>>;

template <typename T>
PendingPtr<T> MakePending(typename Pending<T>::Callback callback) {
  return std::make_shared<Pending<T>>(std::move(callback));
}

struct Unit {};

// Work to run after every lock is released: completions are collected while state is mutated under
// a mutex and delivered afterwards, so a completion may call back into the coordinator (or a
// transport may take its own locks) without lock-order cycles. Declare it before the lock.
class Deferred {
 public:
  Deferred() = default;
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;
  ~Deferred() { RunNow(); }

  void Add(std::function<void()> fn) { fns_.push_back(std::move(fn)); }
  // A database write of state decided under the lock: runs before every reply and notification,
  // so what a caller hears is durable first.
  void AddWrite(std::function<void()> fn) { writes_.push_back(std::move(fn)); }

  template <typename T>
  void Complete(const PendingPtr<T>& pending, absl::StatusOr<T> result) {
    fns_.push_back([pending, result = std::move(result)]() mutable { pending->Complete(std::move(result)); });
  }

  void RunNow() {
    while (!fns_.empty() || !writes_.empty()) {
      std::vector<std::function<void()>> writes;
      writes.swap(writes_);
      for (auto& fn : writes) fn();
      std::vector<std::function<void()>> batch;
      batch.swap(fns_);
      for (auto& fn : batch) fn();
    }
  }

 private:
  std::vector<std::function<void()>> writes_;
  std::vector<std::function<void()>> fns_;
};

}  // namespace dt
