// A run's lock, counted per thread (run_locks_held in pending.h) so that a build with
// DT_CHECK_LOCK_RULE catches a reply completed under it.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/pending.h"

namespace dt {

class ABSL_LOCKABLE RunMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    ++run_locks_held;
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    --run_locks_held;
    mu_.Unlock();
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }

 private:
  absl::Mutex mu_;
};

class ABSL_SCOPED_LOCKABLE RunMutexLock {
 public:
  explicit RunMutexLock(RunMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~RunMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  RunMutexLock(const RunMutexLock&) = delete;
  RunMutexLock& operator=(const RunMutexLock&) = delete;

 private:
  RunMutex* const mu_;
};

}  // namespace dt
