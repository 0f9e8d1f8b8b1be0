#include "client/coordinator_store.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>

#include "common/log.h"

namespace dt {
namespace {

// c10d reports store failures as exceptions; the message keeps the coordinator's explanation.
void Check(const absl::Status& s, const char* op) {
  TORCH_CHECK(s.ok(), "coordinator store ", op, " failed: ", s.ToString());
}

std::string AsString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> AsBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

absl::Duration ToAbsl(std::chrono::milliseconds ms) { return absl::Milliseconds(ms.count()); }

}  // namespace

StoreCombiner::SendBatch CoordinatorStore::Carrier() {
  return [this](v1::StoreRequest r) { return session_->CallCarrying(std::move(r)); };
}

bool CoordinatorStore::Combining() const { return combiner_ && combiner_->Gathering() && session_->Quiescent(); }

bool CoordinatorStore::ReadsMayCombine() const {
  return combiner_ && session_->features().batch_get_if_present() && session_->Quiescent();
}

absl::Duration CoordinatorStore::CarrierTimeout() const {
  return timeout_ == kNoTimeout ? absl::InfiniteDuration() : ToAbsl(timeout_);
}

CoordinatorStore::CoordinatorStore(std::unique_ptr<StoreSession> session, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), session_(std::move(session)) {}

CoordinatorStore::~CoordinatorStore() {
  // A set left for the node's carrier is delivered before the session goes: a peer may wait for
  // it. A stuck carrier delays the exit by at most kSettleAtExit.
  if (!combiner_ || !combiner_->SetUnsettled()) return;
  try {
    absl::Status s = combiner_->SettleSet(Carrier(), std::min(CarrierTimeout(), kSettleAtExit), Resend());
    if (!s.ok()) DT_LOG(Warning) << "coordinator store: the last set of this rank failed: " << s;
  } catch (const std::exception& e) {
    DT_LOG(Warning) << "coordinator store: the last set of this rank failed: " << e.what();
  }
}

StoreCombiner::Resend CoordinatorStore::Resend() {
  return [this](const std::string& key, std::string value) { return session_->SetNoWait(key, std::move(value)); };
}

void CoordinatorStore::SettleSet(const char* op) {
  if (!combiner_ || !combiner_->SetUnsettled()) return;
  absl::Status s = combiner_->SettleSet(Carrier(), CarrierTimeout(), Resend());
  TORCH_CHECK(s.ok(), "coordinator store ", op, " failed: an earlier set of this rank failed: ", s.ToString());
}

void CoordinatorStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Begin("set");
  std::string bytes = AsString(value);
  if (Combining()) {
    // Left for the node's carrier; its answer is read before this rank's next operation.
    std::optional<absl::Status> left = combiner_->Set(key, bytes, Carrier(), CarrierTimeout());
    if (left.has_value()) {
      Check(*left, "set");
      return;
    }
  }
  CheckWritesAllowed("set");
  // Like TCPStore, set does not wait for its answer; the next operation reports a failure.
  Check(session_->SetNoWait(key, std::move(bytes)), "set");
}

std::vector<uint8_t> CoordinatorStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                  const std::vector<uint8_t>& desired) {
  Begin("compareSet");
  CheckWritesAllowed("compareSet");
  absl::StatusOr<std::string> v = session_->CompareSet(key, AsString(expected), AsString(desired));
  Check(v.status(), "compareSet");
  return AsBytes(*v);
}

std::vector<uint8_t> CoordinatorStore::get(const std::string& key) {
  if (std::optional<std::string> fetched = TakeFetched(key)) return AsBytes(*fetched);
  SettleSet("get");
  bool waited = JustWaitedFor(key);
  if (ReadsMayCombine() && (waited || combiner_->Gathering())) {
    std::optional<absl::StatusOr<std::string>> combined = combiner_->GetIfPresent(key, Carrier(), CarrierTimeout());
    if (combined.has_value()) {
      Check(combined->status(), "get");
      return AsBytes(**combined);
    }
  }
  absl::StatusOr<std::string> v = session_->Get(key, ToAbsl(timeout_));
  Check(v.status(), "get");
  return AsBytes(*v);
}

int64_t CoordinatorStore::add(const std::string& key, int64_t value) {
  Begin("add");
  bool combined = combiner_ && session_->Quiescent();
  if (!combined) CheckWritesAllowed("add");
  absl::StatusOr<int64_t> v =
      combined ? combiner_->Add(key, value, Carrier(), CarrierTimeout()) : session_->Add(key, value);
  Check(v.status(), "add");
  return *v;
}

bool CoordinatorStore::deleteKey(const std::string& key) {
  Begin("deleteKey");
  CheckWritesAllowed("deleteKey");
  absl::StatusOr<bool> v = session_->DeleteKey(key);
  Check(v.status(), "deleteKey");
  return *v;
}

bool CoordinatorStore::check(const std::vector<std::string>& keys) {
  Begin("check");
  absl::StatusOr<bool> v = session_->Check(keys);
  Check(v.status(), "check");
  return *v;
}

int64_t CoordinatorStore::getNumKeys() {
  Begin("getNumKeys");
  absl::StatusOr<int64_t> v = session_->NumKeys();
  Check(v.status(), "getNumKeys");
  return *v;
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void CoordinatorStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  Begin("wait");
  JustWaitedFor("");  // a get after this wait follows this wait, not an earlier one
  if (keys.size() == 1 && exchanges_.load() > 0) {
    // In an address exchange: the wait is a get, whose value the get after it takes.
    absl::StatusOr<std::string> value = session_->Get(keys[0], ToAbsl(timeout));
    Check(value.status(), "wait");
    absl::MutexLock lock(&waited_mu_);
    fetched_ = Fetched{keys[0], std::move(*value), std::this_thread::get_id()};
    return;
  }
  auto start = std::chrono::steady_clock::now();
  absl::Duration limit = timeout == kNoTimeout ? absl::InfiniteDuration() : ToAbsl(timeout);
  bool there = false;
  // Batches have taken checks from the start; gated on the same feature as gets, as one rule.
  if (keys.size() == 1 && ReadsMayCombine()) {
    std::optional<absl::StatusOr<bool>> exists =
        combiner_->Exists(keys[0], Carrier(), std::min(CarrierTimeout(), limit));
    if (exists.has_value()) {
      Check(exists->status(), "wait");
      there = **exists;
    }
  }
  if (!there) {
    // The look counts against the wait's timeout (zero still means the run's default).
    absl::Duration left = ToAbsl(timeout);
    if (timeout != kNoTimeout) {
      left = std::max(limit - absl::FromChrono(std::chrono::steady_clock::now() - start), absl::Milliseconds(1));
    }
    Check(session_->Wait(keys, left), "wait");
  }
  if (keys.size() != 1) return;
  absl::MutexLock lock(&waited_mu_);
  last_waited_ = keys[0];
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> CoordinatorStore::clone() {
  C10_THROW_ERROR(NotImplementedError,
                  "dt's coordinator store cannot be cloned (a process group split needs a store of its own)");
}
#endif

void CoordinatorStore::Begin(const char* op) {
  {
    absl::MutexLock lock(&waited_mu_);
    fetched_.reset();
  }
  SettleSet(op);
}

std::optional<std::string> CoordinatorStore::TakeFetched(const std::string& key) {
  absl::MutexLock lock(&waited_mu_);
  std::optional<Fetched> fetched = std::move(fetched_);
  fetched_.reset();
  if (!fetched || fetched->key != key || fetched->thread != std::this_thread::get_id()) return std::nullopt;
  return std::move(fetched->value);
}

void CoordinatorStore::CheckWritesAllowed(const char* op) {
  if (combiner_) Check(combiner_->WritesAllowed(), op);
}

bool CoordinatorStore::JustWaitedFor(const std::string& key) {
  absl::MutexLock lock(&waited_mu_);
  bool waited = !last_waited_.empty() && last_waited_ == key;
  last_waited_.clear();
  return waited;
}

}  // namespace dt
