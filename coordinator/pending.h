// Asynchronous replies. The coordinator's logic never blocks a thread on a waiting caller (a
// rendezvous, a barrier, a blocking store get): it keeps a Pending and completes it later, from
// whichever thread makes the condition true or from the timer that expires it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dt {

// A reply that is delivered exactly once: by the logic, or by the transport when the caller
// cancels. Later attempts are ignored.
template <typename T>
class Pending {
 public:
  using Callback = std::function<void(absl::StatusOr<T>)>;
  explicit Pending(Callback callback) : callback_(std::move(callback)) {}

  // Returns false (and does nothing) if the reply was already delivered.
  bool Complete(absl::StatusOr<T> result) {
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

  template <typename T>
  void Complete(const PendingPtr<T>& pending, absl::StatusOr<T> result) {
    fns_.push_back([pending, result = std::move(result)]() mutable { pending->Complete(std::move(result)); });
  }

  void RunNow() {
    while (!fns_.empty()) {
      std::vector<std::function<void()>> batch;
      batch.swap(fns_);
      for (auto& fn : batch) fn();
    }
  }

 private:
  std::vector<std::function<void()>> fns_;
};

}  // namespace dt
