// The key-value store of one run generation, with c10d Store semantics: set, blocking get,
// atomic add, compare-set, check, blocking wait, delete, num-keys. Blocking calls hold no thread:
// they park a Pending that a later set/add/compare-set completes, or a timer expires.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/limits.h"
#include "coordinator/pending.h"
#include "coordinator/shared_budget.h"
#include "coordinator/timer_queue.h"

namespace dt {

struct StoreLimits {
  int64_t max_keys = kMaxKeysPerRun;
  int64_t max_bytes = kDefaultStoreBytesPerRun;  // keys plus values of this store
  // Bytes (keys plus values) held by every store of one coordinator (may be null): a run's own
  // limit bounds one run, this bounds the process.
  SharedBudget* shared = nullptr;
};

class KvStore : public std::enable_shared_from_this<KvStore> {
 public:
  // `scope` names the store in messages ("run r-… generation 2"). Always held by a shared_ptr:
  // timers keep a weak reference. A set that would pass a limit is refused with
  // RESOURCE_EXHAUSTED naming it, and nothing changes.
  KvStore(std::string scope, TimerQueue* timers, StoreLimits limits);
  ~KvStore();

  absl::Status Set(const std::string& key, std::string value, Deferred& deferred);
  // Completes `reply` with the value once `key` exists, or DEADLINE_EXCEEDED after `timeout`.
  void Get(const std::string& key, absl::Duration timeout, PendingPtr<std::string> reply, Deferred& deferred);
  // The value of `key` now, without waiting: nullopt when it is not there.
  absl::StatusOr<std::optional<std::string>> GetIfPresent(const std::string& key);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta, Deferred& deferred);
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected, std::string desired,
                                         Deferred& deferred);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  // Completes `reply` once every key exists, or DEADLINE_EXCEEDED naming the missing keys.
  void Wait(const std::vector<std::string>& keys, absl::Duration timeout, PendingPtr<Unit> reply, Deferred& deferred);
  absl::StatusOr<bool> DeleteKey(const std::string& key);
  absl::StatusOr<int64_t> NumKeys();

  // Fails every parked call and every later call with `cause` (ABORTED: the generation ended).
  void Abort(const absl::Status& cause, Deferred& deferred);
  bool aborted() const;
  size_t waiting() const;

 private:
  struct Waiter {
    uint64_t id;
    std::string get_key;                             // set for Get: the key whose value is returned
    absl::flat_hash_map<std::string, bool> missing;  // keys not yet present
    PendingPtr<std::string> get_reply;
    PendingPtr<Unit> wait_reply;
    TimerQueue::Id timer = 0;
    absl::Duration timeout;
    int64_t charged = 0;  // bytes this parked call holds, charged against the run's store budget
  };

  absl::Status CheckUsable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Store(const std::string& key, std::string value, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parks a call until its keys exist, its bytes (the keys it waits for and their bookkeeping)
  // charged to the run's budget like stored ones: RESOURCE_EXHAUSTED, nothing parked, past it.
  absl::Status Park(std::unique_ptr<Waiter> waiter, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Waiter& waiter, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Expire(uint64_t waiter_id);

  const std::string scope_;
  TimerQueue* const timers_;
  // Charges (or refunds) a change of `delta` bytes against both limits.
  absl::Status Charge(const std::string& key, int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiters_by_key_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dt
