#include "coordinator/kv_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/duration.h"
#include "common/limits.h"
#include "common/names.h"

namespace dt {
namespace {

// The bookkeeping of a parked call, and of each key it waits for, beyond the key's own bytes.
constexpr int64_t kParkedCallBytes = 256;
constexpr int64_t kParkedKeyBytes = 96;

}  // namespace
namespace {

absl::Status ValidateValue(const std::string& key, const std::string& value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value for store key ", Quote(key), " is ", value.size(),
                                                   " bytes; the limit is ", kMaxValueBytes, " (4 MiB)"));
  }
  return absl::OkStatus();
}

std::string NameKeys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) shown.push_back(Quote(keys[i]));
  std::string out = absl::StrJoin(shown, ", ");
  if (keys.size() > kShown) absl::StrAppend(&out, " and ", keys.size() - kShown, " more");
  return out;
}

}  // namespace

KvStore::KvStore(std::string scope, TimerQueue* timers, StoreLimits limits)
    : scope_(std::move(scope)), timers_(timers), limits_(limits) {}

KvStore::~KvStore() {
  absl::MutexLock lock(&mu_);
  if (limits_.shared != nullptr) limits_.shared->Release(bytes_);
  for (auto& [id, waiter] : waiters_) {
    if (waiter->timer != 0) timers_->Cancel(waiter->timer);
  }
}

absl::Status KvStore::CheckUsable() const {
  if (!aborted_.ok()) return aborted_;
  return absl::OkStatus();
}

bool KvStore::aborted() const {
  absl::MutexLock lock(&mu_);
  return !aborted_.ok();
}

size_t KvStore::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

absl::Status KvStore::Charge(const std::string& key, int64_t delta) {
  if (delta <= 0) {
    bytes_ += delta;
    if (limits_.shared != nullptr) limits_.shared->Release(-delta);
    return absl::OkStatus();
  }
  if (bytes_ + delta > limits_.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store of ", scope_, " holds ", bytes_, " bytes of keys, values and waiting calls; setting ",
                     Quote(key), " would pass the limit of ", limits_.max_bytes,
                     " bytes per run (dtcoord --store-bytes-per-run); delete keys the run no longer needs"));
  }
  if (limits_.shared != nullptr && !limits_.shared->TryCharge(delta)) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator's stores hold ", limits_.shared->used(),
                                                     " bytes; setting ", Quote(key), " in ", scope_,
                                                     " would pass the limit of ", limits_.shared->limit(),
                                                     " bytes for all runs together (dtcoord --store-bytes-total)"));
  }
  bytes_ += delta;
  return absl::OkStatus();
}

absl::Status KvStore::Store(const std::string& key, std::string value, Deferred& deferred) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (static_cast<int64_t>(data_.size()) >= limits_.max_keys) {
      return absl::ResourceExhaustedError(absl::StrCat("store of ", scope_, " holds ", data_.size(),
                                                       " keys; the limit is ", limits_.max_keys, " keys per run (key ",
                                                       Quote(key), " not added)"));
    }
    int64_t size = static_cast<int64_t>(key.size() + value.size());
    if (absl::Status s = Charge(key, size); !s.ok()) return s;
    data_.emplace(key, std::move(value));
  } else {
    int64_t delta = static_cast<int64_t>(value.size()) - static_cast<int64_t>(it->second.size());
    if (absl::Status s = Charge(key, delta); !s.ok()) return s;
    it->second = std::move(value);
  }
  // Wake callers waiting for this key.
  auto waiting = waiters_by_key_.find(key);
  if (waiting == waiters_by_key_.end()) return absl::OkStatus();
  std::vector<uint64_t> ids = std::move(waiting->second);
  waiters_by_key_.erase(waiting);
  for (uint64_t id : ids) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    w->second->missing.erase(key);
    if (w->second->missing.empty()) Finish(*w->second, deferred);
  }
  return absl::OkStatus();
}

void KvStore::Finish(Waiter& waiter, Deferred& deferred) {
  if (waiter.timer != 0) timers_->Cancel(waiter.timer);
  (void)Charge("", -waiter.charged);
  if (waiter.get_reply) {
    deferred.Complete<std::string>(waiter.get_reply, data_.at(waiter.get_key));
  } else {
    deferred.Complete<Unit>(waiter.wait_reply, Unit{});
  }
  waiters_.erase(waiter.id);  // destroys `waiter`
}

absl::Status KvStore::Set(const std::string& key, std::string value, Deferred& deferred) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  if (absl::Status s = ValidateValue(key, value); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  return Store(key, std::move(value), deferred);
}

absl::Status KvStore::Park(std::unique_ptr<Waiter> waiter, Deferred& deferred) {
  // What a parked call costs the coordinator: its keys, twice (the call's list and the index of
  // waiters by key), and the bookkeeping around each.
  int64_t bytes = kParkedCallBytes;
  for (const auto& [key, unused] : waiter->missing) bytes += 2 * static_cast<int64_t>(key.size()) + kParkedKeyBytes;
  if (bytes_ + bytes > limits_.max_bytes || (limits_.shared != nullptr && !limits_.shared->TryCharge(bytes))) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a ", waiter->get_reply ? "get" : "wait", " for ", waiter->missing.size(), " key(s) in ", scope_,
                     " would hold ", bytes, " bytes while it waits; with the ", bytes_,
                     " bytes the run's store holds that passes the limit of ",
                     bytes_ + bytes > limits_.max_bytes ? limits_.max_bytes : limits_.shared->limit(),
                     bytes_ + bytes > limits_.max_bytes ? " bytes per run (dtcoord --store-bytes-per-run)"
                                                        : " bytes for all runs together (dtcoord --store-bytes-total)",
                     ": wait for fewer keys at a time"));
  }
  bytes_ += bytes;
  waiter->charged = bytes;
  uint64_t id = next_waiter_id_++;
  waiter->id = id;
  for (const auto& [key, unused] : waiter->missing) waiters_by_key_[key].push_back(id);
  std::weak_ptr<KvStore> weak = weak_from_this();
  waiter->timer = timers_->Schedule(timers_->clock()->Now() + waiter->timeout, [weak, id] {
    if (auto self = weak.lock()) self->Expire(id);
  });
  waiters_.emplace(id, std::move(waiter));
  (void)deferred;
  return absl::OkStatus();
}

void KvStore::Get(const std::string& key, absl::Duration timeout, PendingPtr<std::string> reply, Deferred& deferred) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) {
    deferred.Complete<std::string>(reply, s);
    return;
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) {
    deferred.Complete<std::string>(reply, s);
    return;
  }
  auto it = data_.find(key);
  if (it != data_.end()) {
    deferred.Complete<std::string>(reply, it->second);
    return;
  }
  auto waiter = std::make_unique<Waiter>();
  waiter->get_key = key;
  waiter->missing.emplace(key, true);
  waiter->get_reply = reply;
  waiter->timeout = timeout;
  if (absl::Status s = Park(std::move(waiter), deferred); !s.ok()) deferred.Complete<std::string>(reply, s);
}

absl::StatusOr<std::optional<std::string>> KvStore::GetIfPresent(const std::string& key) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

void KvStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout, PendingPtr<Unit> reply,
                   Deferred& deferred) {
  for (const auto& key : keys) {
    if (absl::Status s = ValidateStoreKey(key); !s.ok()) {
      deferred.Complete<Unit>(reply, s);
      return;
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) {
    deferred.Complete<Unit>(reply, s);
    return;
  }
  auto waiter = std::make_unique<Waiter>();
  for (const auto& key : keys) {
    if (!data_.contains(key)) waiter->missing.emplace(key, true);
  }
  if (waiter->missing.empty()) {
    deferred.Complete<Unit>(reply, Unit{});
    return;
  }
  waiter->wait_reply = reply;
  waiter->timeout = timeout;
  if (absl::Status s = Park(std::move(waiter), deferred); !s.ok()) deferred.Complete<Unit>(reply, s);
}

void KvStore::Expire(uint64_t waiter_id) {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) return;
  Waiter& w = *it->second;
  std::vector<std::string> missing;
  for (const auto& [key, unused] : w.missing) missing.push_back(key);
  std::sort(missing.begin(), missing.end());
  absl::Status status = absl::DeadlineExceededError(absl::StrCat(
      w.get_reply ? "store get" : "store wait", " in ", scope_, " timed out after ", absl::FormatDuration(w.timeout),
      "; missing key", missing.size() == 1 ? " " : "s ", NameKeys(missing)));
  for (const auto& key : missing) {
    auto& ids = waiters_by_key_[key];
    ids.erase(std::remove(ids.begin(), ids.end(), waiter_id), ids.end());
    if (ids.empty()) waiters_by_key_.erase(key);
  }
  if (w.get_reply) {
    deferred.Complete<std::string>(w.get_reply, status);
  } else {
    deferred.Complete<Unit>(w.wait_reply, status);
  }
  (void)Charge("", -w.charged);
  waiters_.erase(it);
  // `deferred` runs after the lock is released (declared first, destroyed last).
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta, Deferred& deferred) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store add on key ", Quote(key), " whose value is not an integer: ", Quote(it->second)));
  }
  int64_t updated = 0;
  if (__builtin_add_overflow(current, delta, &updated)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store add on key ", Quote(key), " overflows int64 (", current, " + ", delta, ")"));
  }
  if (absl::Status s = Store(key, absl::StrCat(updated), deferred); !s.ok()) return s;
  return updated;
}

absl::StatusOr<std::string> KvStore::CompareSet(const std::string& key, const std::string& expected,
                                                std::string desired, Deferred& deferred) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  if (absl::Status s = ValidateValue(key, desired); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;  // c10d TCPStore answers `expected` here
    if (absl::Status s = Store(key, desired, deferred); !s.ok()) return s;
    return desired;
  }
  if (it->second == expected) {
    if (absl::Status s = Store(key, desired, deferred); !s.ok()) return s;
    return desired;
  }
  return it->second;
}

absl::StatusOr<bool> KvStore::Check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  for (const auto& key : keys) {
    if (!data_.contains(key)) return false;
  }
  return true;
}

absl::StatusOr<bool> KvStore::DeleteKey(const std::string& key) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  (void)Charge(key, -static_cast<int64_t>(key.size() + it->second.size()));
  data_.erase(it);
  return true;
}

absl::StatusOr<int64_t> KvStore::NumKeys() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  return static_cast<int64_t>(data_.size());
}

void KvStore::Abort(const absl::Status& cause, Deferred& deferred) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return;
  aborted_ = cause;
  for (auto& [id, w] : waiters_) {
    if (w->timer != 0) timers_->Cancel(w->timer);
    if (w->get_reply) {
      deferred.Complete<std::string>(w->get_reply, cause);
    } else {
      deferred.Complete<Unit>(w->wait_reply, cause);
    }
  }
  waiters_.clear();
  waiters_by_key_.clear();
  data_.clear();
  (void)Charge("", -bytes_);
}

}  // namespace dt
