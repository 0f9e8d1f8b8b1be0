#include "client/store_combiner.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>
#include <optional>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/node_segment.h"
#include "client/store_session.h"
#include "common/duration.h"
#include "common/limits.h"
#include "common/utf8.h"

namespace dt {
namespace {

// In the segment's name: a build with another layout never maps this one.
constexpr int kLayoutVersion = 5;
constexpr size_t kMessageBytes = 512;
// How often a waiting operation looks at the carrier lock on its own: only matters when a carrier
// died (the live ones wake the next carrier themselves).
constexpr int64_t kRecheckMillis = 50;

// A slot's state, also its futex word. Only the owner moves it out of kDone/kIdle, only the
// carrier out of kTaken + lane.
enum : uint32_t {
  kIdle = 0,
  kPending = 1,  // written by its owner, waiting for a carrier
  kNudged = 2,   // pending, and told by the last carrier to carry the next batch
  kDone = 3,     // answered: the owner reads the result
  kTaken = 4,    // kTaken + lane: in that lane's batch
};

// A lane's flag while its batch is in flight.
enum : uint32_t { kCarryingLooksAfter = 1, kCarryingFinal = 2 };

enum class OpKind : uint32_t { kAdd, kSet, kGetIfPresent, kCheck };

struct OpSlot {
  std::atomic<int32_t> owner;  // the pid holding the slot; 0: free
  OpKind kind;
  int64_t delta;
  uint32_t key_len;
  char key[kMaxKeyBytes];
  // A set's value; a get's answer.
  uint32_t value_len;
  char value[StoreCombiner::kSlotValueBytes];
  // The answer.
  int32_t code;
  int64_t number;
  bool present;          // a get found its key and its value is in `value`
  bool carried_failure;  // `code` is the batch's failure, not this operation's own
  uint32_t message_len;
  char message[kMessageBytes];
};

// The status a carrier wrote to the slot.
absl::Status AnswerStatus(const OpSlot& slot) {
  if (slot.code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(slot.code), std::string(slot.message, slot.message_len));
}

}  // namespace

struct StoreCombiner::Shared {
  // Process-shared and robust: each held by a carrier during its batch.
  pthread_mutex_t carrier_mu[kLanes];
  // Non-zero while the lane's batch is in flight (Gathering): kCarryingLooksAfter, or
  // kCarryingFinal for a carrier's last batch. Sequentially consistent where it is set and read for
  // left sets (see the header's "Left sets").
  std::atomic<uint32_t> carrying[kLanes];
  std::atomic<int32_t> carrier_pid[kLanes];  // who carries the lane's batch: named when it is late
  // When the lane's carrier took it (MonotonicNowNs); 0 while free. A lane held longer than an
  // operation would wait for it is held by a carrier that is stopped or stuck: later operations
  // then go alone at once instead of each waiting out its own go_alone_after.
  std::atomic<int64_t> carried_since_ns[kLanes];
  std::atomic<int32_t> slots_used;  // one past the highest slot ever taken: what a carrier scans
  // Dense, so a carrier's scan touches a few cache lines.
  std::atomic<uint32_t> state[kSlots];
  // 1 while the slot holds a set its owner left (StoreCombiner::Set) and does not wait for: never
  // nudged, since nobody would wake to carry.
  std::atomic<uint32_t> left_set[kSlots];
  OpSlot slots[kSlots];
};

struct StoreCombiner::SlotOp {
  OpKind kind;
  const std::string& key;
  int64_t delta = 0;
  const std::string* value = nullptr;  // kSet
};

struct StoreCombiner::SlotAnswer {
  absl::Status status;
  bool carried_failure = false;  // the status is the carrier's failure: a set or get may go again
  int64_t number = 0;
  bool present = false;
  std::string value;
};

absl::StatusOr<std::unique_ptr<StoreCombiner>> StoreCombiner::Open(const std::string& run_id, int64_t generation,
                                                                   const std::string& node, int ranks_on_node) {
  absl::StatusOr<std::unique_ptr<NodeSegment>> segment = NodeSegment::Open(
      "combiner", kLayoutVersion, run_id, generation, node, sizeof(Shared), ranks_on_node, [](void* memory) {
        Shared* shared = new (memory) Shared();
        for (pthread_mutex_t& mu : shared->carrier_mu) InitSharedRobustMutex(&mu);
      });
  if (!segment.ok()) return segment.status();
  std::unique_ptr<StoreCombiner> combiner(new StoreCombiner());
  combiner->segment_ = std::move(*segment);
  combiner->shared_ = static_cast<Shared*>(combiner->segment_->data());
  Shared& shared = *combiner->shared_;
  for (int i = 0; i < kSlots; ++i) {
    int32_t free = 0;
    if (!shared.slots[i].owner.compare_exchange_strong(free, static_cast<int32_t>(::getpid()))) continue;
    combiner->slot_ = i;
    shared.left_set[i].store(0);  // a previous owner may have exited with a set left
    int32_t used = shared.slots_used.load();
    while (used < i + 1 && !shared.slots_used.compare_exchange_weak(used, i + 1)) {
    }
    return combiner;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("every one of the ", kSlots, " store combiner slots of this node is taken"));
}

StoreCombiner::~StoreCombiner() {
  if (shared_ != nullptr && slot_ >= 0) {
    shared_->left_set[slot_].store(0);  // a set still left is carried as any pending operation
    shared_->slots[slot_].owner.store(0);
  }
  // When not every rank of the node opened it, the name would stay behind: remove it (a rank
  // opening later makes a segment of its own, which is only less combining).
  if (segment_) segment_->Unlink();
}

absl::StatusOr<int64_t> StoreCombiner::Add(const std::string& key, int64_t delta, const SendBatch& send,
                                           absl::Duration timeout) {
  if (key.size() > kMaxKeyBytes) return AddAlone(key, delta, send);
  std::optional<SlotAnswer> answer = TryThroughSlot(SlotOp{OpKind::kAdd, key, delta}, send, timeout);
  if (!answer.has_value()) return AddAlone(key, delta, send);
  if (!answer->status.ok()) return answer->status;
  return answer->number;
}

std::optional<absl::Status> StoreCombiner::Set(const std::string& key, const std::string& value, const SendBatch& send,
                                               absl::Duration timeout) {
  if (key.size() > kMaxKeyBytes || value.size() > kSlotValueBytes) return std::nullopt;
  if (!local_mu_.TryLock()) return std::nullopt;
  // Unlocked however LeaveSet ends (`send` may throw), as in TryThroughSlot.
  std::optional<absl::Status> left;
  try {
    left = LeaveSet(SlotOp{OpKind::kSet, key, 0, &value}, send, timeout);
  } catch (...) {
    local_mu_.Unlock();
    throw;
  }
  local_mu_.Unlock();
  return left;
}

std::optional<absl::Status> StoreCombiner::LeaveSet(const SlotOp& op, const SendBatch& send, absl::Duration timeout) {
  if (absl::Status allowed = WritesAllowed(); !allowed.ok()) return allowed;
  // A stuck lane's carrier would not come back for it: go alone at once, as other operations do.
  if (LanesStuck() || !TakeSlot()) return std::nullopt;
  std::atomic<uint32_t>& state = shared_->state[slot_];
  WriteSlot(op);
  shared_->left_set[slot_].store(1);  // before it is pending: a nudger that sees it pending sees this
  set_unsettled_.store(true);
  state.store(kPending);
  auto start = std::chrono::steady_clock::now();
  absl::Duration go_alone_after = std::min(go_alone_after_, timeout);
  while (true) {
    uint32_t seen = state.load();
    if (seen != kPending && seen != kNudged) return absl::OkStatus();  // taken (or answered already)
    // Tried first: a lane whose carrier died is taken over (its flag may still say in flight).
    Carry carried = TryCarry(send);
    if (carried == Carry::kCarried) continue;
    if (carried == Carry::kBusy && AnyLaneLooksAfter()) return absl::OkStatus();
    bool give_up = carried == Carry::kUnrecoverable ||
                   absl::FromChrono(std::chrono::steady_clock::now() - start) >= go_alone_after;
    if (give_up && state.compare_exchange_strong(seen, kIdle)) {
      shared_->left_set[slot_].store(0);
      set_unsettled_.store(false);
      return std::nullopt;
    }
    // A final batch in flight, or a lane between its lock and its flag: look again shortly.
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::Status StoreCombiner::SettleSet(const SendBatch& send, absl::Duration timeout, const Resend& resend) {
  if (!set_unsettled_.load()) return absl::OkStatus();
  absl::MutexLock lock(&local_mu_);
  if (!set_unsettled_.load()) return absl::OkStatus();
  set_unsettled_.store(false);
  std::atomic<uint32_t>& state = shared_->state[slot_];
  OpSlot& slot = shared_->slots[slot_];
  shared_->left_set[slot_].store(0);  // waited for from now on: it may be nudged
  Awaited awaited = AwaitAnswer(send, timeout);
  // A set is not overwritten by its answer: its key and value are still in the slot.
  auto again = [&] { return resend(std::string(slot.key, slot.key_len), std::string(slot.value, slot.value_len)); };
  if (awaited == Awaited::kGoAlone) return again();
  uint32_t now = state.load();
  if (awaited == Awaited::kLate && now != kDone) {
    late_write_.store(true);
    return LateWriteError(timeout, now);
  }
  absl::Status status = AnswerStatus(slot);
  bool undelivered = slot.carried_failure;
  absl::Status resent = undelivered ? again() : absl::OkStatus();
  state.store(kIdle);
  return undelivered ? resent : status;
}

std::optional<absl::StatusOr<std::string>> StoreCombiner::GetIfPresent(const std::string& key, const SendBatch& send,
                                                                       absl::Duration timeout) {
  if (key.size() > kMaxKeyBytes) return std::nullopt;
  std::optional<SlotAnswer> answer = TryThroughSlot(SlotOp{OpKind::kGetIfPresent, key}, send, timeout);
  if (!answer.has_value() || answer->carried_failure) return std::nullopt;
  if (!answer->status.ok()) return answer->status;
  if (!answer->present) return std::nullopt;
  return std::move(answer->value);
}

std::optional<absl::StatusOr<bool>> StoreCombiner::Exists(const std::string& key, const SendBatch& send,
                                                          absl::Duration timeout) {
  if (key.size() > kMaxKeyBytes) return std::nullopt;
  std::optional<SlotAnswer> answer = TryThroughSlot(SlotOp{OpKind::kCheck, key}, send, timeout);
  if (!answer.has_value() || answer->carried_failure) return std::nullopt;
  if (!answer->status.ok()) return answer->status;
  return answer->present;
}

int32_t StoreCombiner::CarrierOf(uint32_t state) const {
  return state >= kTaken && state < kTaken + kLanes ? shared_->carrier_pid[state - kTaken].load() : 0;
}

absl::Status StoreCombiner::WritesAllowed() {
  if (!late_write_.load()) return absl::OkStatus();
  uint32_t now = shared_->state[slot_].load();
  if (now == kDone || now == kIdle) {
    late_write_.store(false);  // answered at last: nothing of it can land later
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "an earlier store write of this rank timed out in the batch of the rank of this node that carries it (pid ",
      CarrierOf(now), "), which still holds it: a write now could be applied before it. The store is unusable ",
      "until that process delivers it or dies."));
}

bool StoreCombiner::Gathering() const {
  bool in_flight = false;
  for (const std::atomic<uint32_t>& carrying : shared_->carrying) {
    in_flight = in_flight || carrying.load(std::memory_order_relaxed) != 0;
  }
  return in_flight && pending() > 0;
}

std::optional<StoreCombiner::SlotAnswer> StoreCombiner::TryThroughSlot(const SlotOp& op, const SendBatch& send,
                                                                       absl::Duration timeout) {
  if (!local_mu_.TryLock()) return std::nullopt;
  // Unlocked however ThroughSlot ends (`send` may throw). This absl has no adopting MutexLock.
  std::optional<SlotAnswer> answer;
  try {
    answer = ThroughSlot(op, send, timeout);
  } catch (...) {
    local_mu_.Unlock();
    throw;
  }
  local_mu_.Unlock();
  return answer;
}

std::optional<StoreCombiner::SlotAnswer> StoreCombiner::ThroughSlot(const SlotOp& op, const SendBatch& send,
                                                                    absl::Duration timeout) {
  std::atomic<uint32_t>& state = shared_->state[slot_];
  bool write = op.kind == OpKind::kAdd || op.kind == OpKind::kSet;
  if (absl::Status allowed = WritesAllowed(); write && !allowed.ok()) {
    SlotAnswer refused;
    refused.status = std::move(allowed);
    return refused;
  }
  if (!TakeSlot()) return std::nullopt;
  WriteSlot(op);
  state.store(kPending);
  Awaited awaited = AwaitAnswer(send, timeout);
  if (awaited == Awaited::kGoAlone) return std::nullopt;
  const OpSlot& slot = shared_->slots[slot_];
  SlotAnswer answer;
  uint32_t now = state.load();
  if (awaited == Awaited::kLate && now != kDone) {
    if (!write) return std::nullopt;  // reading again elsewhere changes nothing
    late_write_.store(true);
    answer.status = LateWriteError(timeout, now);
    return answer;
  }
  answer.carried_failure = slot.carried_failure;
  answer.number = slot.number;
  answer.present = slot.present;
  if (slot.present) answer.value.assign(slot.value, slot.value_len);
  answer.status = AnswerStatus(slot);
  state.store(kIdle);
  return answer;
}

bool StoreCombiner::TakeSlot() {
  // A set left here is read by SettleSet first (the caller's duty); until then the slot is its.
  if (set_unsettled_.load()) return false;
  std::atomic<uint32_t>& state = shared_->state[slot_];
  // The slot of an operation this process stopped waiting for stays its carrier's until answered,
  // and that answer is nobody's.
  uint32_t left = state.load();
  if (left == kDone) state.store(kIdle);
  return left == kDone || left == kIdle;
}

void StoreCombiner::WriteSlot(const SlotOp& op) {
  OpSlot& slot = shared_->slots[slot_];
  slot.kind = op.kind;
  std::memcpy(slot.key, op.key.data(), op.key.size());
  slot.key_len = static_cast<uint32_t>(op.key.size());
  slot.delta = op.delta;
  slot.value_len = 0;
  if (op.value != nullptr) {
    std::memcpy(slot.value, op.value->data(), op.value->size());
    slot.value_len = static_cast<uint32_t>(op.value->size());
  }
}

absl::Status StoreCombiner::LateWriteError(absl::Duration timeout, uint32_t state) const {
  return absl::DeadlineExceededError(absl::StrCat(
      "a store operation waited ", absl::FormatDuration(timeout), " (the store's timeout) for the rank of this ",
      "node that carries it to the coordinator (pid ", CarrierOf(state), ") to deliver it; it may or may not have ",
      "been applied. Is that process stopped or stuck?"));
}

StoreCombiner::Awaited StoreCombiner::AwaitAnswer(const SendBatch& send, absl::Duration timeout) {
  std::atomic<uint32_t>& state = shared_->state[slot_];
  // Monotonic: a step of the wall clock neither ends a wait early nor stretches it.
  auto start = std::chrono::steady_clock::now();
  auto waited = [&] { return absl::FromChrono(std::chrono::steady_clock::now() - start); };
  absl::Duration go_alone_after = std::min(go_alone_after_, timeout);
  while (true) {
    uint32_t seen = state.load();
    if (seen == kDone) return Awaited::kAnswered;
    if (seen == kNudged) {
      state.compare_exchange_strong(seen, kPending);
      continue;
    }
    // A pending operation tries to carry (its batch holds this one, unless another carrier took
    // it meanwhile: then it is kTaken or kDone by now). A taken one tries too, on each recheck: a
    // lane is free while one of its operations is still taken only when its carrier died (a live
    // carrier answers every operation before it unlocks), and taking the lane answers them.
    Carry carried = TryCarry(send);
    if (carried == Carry::kCarried) continue;
    // Nobody took it: a lane locked for good (a carrier and then its recoverer died), or held by a
    // carrier that is not running (for this operation's go_alone_after, or for longer than that
    // before it came), sends nothing of it. Go alone.
    if (seen == kPending && (carried == Carry::kUnrecoverable || waited() >= go_alone_after || LanesStuck())) {
      if (state.compare_exchange_strong(seen, kIdle)) return Awaited::kGoAlone;
      continue;  // taken (or nudged) meanwhile
    }
    if (seen >= kTaken && waited() >= timeout) return Awaited::kLate;
    FutexWait(&state, seen, absl::Milliseconds(kRecheckMillis));
  }
}

namespace {

// The batch's own failure: the stream's, or the coordinator's refusal of the whole batch.
absl::Status BatchStatus(const absl::StatusOr<v1::StoreResponse>& answered) {
  return answered.ok() ? StatusOf(*answered) : answered.status();
}

// `send`'s answer; an exception it throws (out of memory) as an UNKNOWN status, so that the
// batch's operations, other ranks' among them, are answered and the lane is let go.
absl::StatusOr<v1::StoreResponse> SendCatching(const StoreCombiner::SendBatch& send, v1::StoreRequest request) {
  try {
    return send(std::move(request));
  } catch (const std::exception& e) {
    return absl::UnknownError(absl::StrCat("sending the node's store batch failed (", e.what(),
                                           "); its operations may or may not have been applied"));
  } catch (...) {
    return absl::UnknownError(
        "sending the node's store batch failed (an exception); its operations may or may not have been applied");
  }
}

// The answer to a batch of one add.
absl::StatusOr<int64_t> AddResult(const v1::StoreResponse& r) {
  if (absl::Status s = StatusOf(r); !s.ok()) return s;
  return r.number();
}

// Writes an operation's answer to its slot: `status`, and when it is OK what `r` says. A get's
// value the coordinator left out (longer than a slot holds) leaves present false: its owner gets
// it itself. `carried_failure`: the status is the batch's (the carrier's stream failed or the
// carrier died), not the operation's own.
void Answer(OpSlot& slot, const absl::Status& status, const v1::StoreResponse* r = nullptr,
            bool carried_failure = false) {
  slot.code = static_cast<int32_t>(status.code());
  slot.carried_failure = carried_failure;
  slot.number = status.ok() && r != nullptr ? r->number() : 0;
  bool answered = status.ok() && r != nullptr;
  slot.present = answered && slot.kind == OpKind::kGetIfPresent && r->flag() &&
                 r->value().size() <= StoreCombiner::kSlotValueBytes &&
                 r->number() <= static_cast<int64_t>(r->value().size());
  if (slot.kind == OpKind::kCheck) slot.present = answered && r->flag();
  if (slot.present && slot.kind == OpKind::kGetIfPresent) {
    std::memcpy(slot.value, r->value().data(), r->value().size());
    slot.value_len = static_cast<uint32_t>(r->value().size());
  }
  std::string message = TruncateUtf8(status.message(), kMessageBytes);
  slot.message_len = static_cast<uint32_t>(message.size());
  std::memcpy(slot.message, message.data(), message.size());
}

// The slot's operation, as a batch holds it.
void AddToBatch(const OpSlot& slot, uint64_t id, v1::StoreBatchRequest& batch) {
  v1::StoreRequest* op = batch.add_ops();
  op->set_id(id);
  std::string key(slot.key, slot.key_len);
  switch (slot.kind) {
    case OpKind::kAdd:
      op->mutable_add()->set_key(std::move(key));
      op->mutable_add()->set_delta(slot.delta);
      break;
    case OpKind::kSet:
      op->mutable_set()->set_key(std::move(key));
      op->mutable_set()->set_value(std::string(slot.value, slot.value_len));
      break;
    case OpKind::kGetIfPresent:
      op->mutable_get()->set_key(std::move(key));
      op->mutable_get()->set_if_present(true);
      op->mutable_get()->set_max_value_bytes(static_cast<int64_t>(StoreCombiner::kSlotValueBytes));
      break;
    case OpKind::kCheck:
      op->mutable_check()->add_keys(std::move(key));
      break;
  }
}

}  // namespace

absl::StatusOr<int64_t> StoreCombiner::AddAlone(const std::string& key, int64_t delta, const SendBatch& send) {
  v1::StoreRequest request;
  v1::StoreRequest* op = request.mutable_batch()->add_ops();
  op->mutable_add()->set_key(key);
  op->mutable_add()->set_delta(delta);
  absl::StatusOr<v1::StoreResponse> answered = send(std::move(request));
  if (absl::Status failed = BatchStatus(answered); !failed.ok()) return failed;
  if (answered->batch_size() != 1)
    return absl::InternalError("the coordinator's answer to a batch of one add left it out");
  return AddResult(answered->batch(0));
}

StoreCombiner::Carry StoreCombiner::TryCarry(const SendBatch& send) {
  Carry carried = TakeLaneAndCarry(send, /*final=*/false);
  if (carried == Carry::kCarried) HandOnPending(send);
  return carried;
}

StoreCombiner::Carry StoreCombiner::TakeLaneAndCarry(const SendBatch& send, bool final) {
  bool unrecoverable = false;
  for (int lane = 0; lane < kLanes; ++lane) {
    pthread_mutex_t* mu = &shared_->carrier_mu[lane];
    int locked = pthread_mutex_trylock(mu);
    unrecoverable = unrecoverable || locked == ENOTRECOVERABLE;
    if (locked != 0 && locked != EOWNERDEAD) continue;
    if (locked == EOWNERDEAD) {
      pthread_mutex_consistent(mu);
      FailOrphans(lane);
    }
    // Set and cleared by whoever holds the lane, so a carrier that died holding it leaves it set
    // only until the next one carries.
    absl::Cleanup unlock = [mu] { pthread_mutex_unlock(mu); };  // however CarryPending ends
    shared_->carrier_pid[lane].store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
    shared_->carried_since_ns[lane].store(MonotonicNowNs(), std::memory_order_relaxed);
    shared_->carrying[lane].store(final ? kCarryingFinal : kCarryingLooksAfter);
    // Cleared before the lock is let go (cleanups run in reverse order).
    absl::Cleanup clear = [&] {
      shared_->carrying[lane].store(0);
      shared_->carried_since_ns[lane].store(0, std::memory_order_relaxed);
    };
    CarryPending(lane, send);
    return Carry::kCarried;
  }
  return unrecoverable ? Carry::kUnrecoverable : Carry::kBusy;
}

void StoreCombiner::HandOnPending(const SendBatch& send) {
  // The lane was let go before this look, so a set left while it was in flight is seen here (see
  // the header's "Left sets"). Busy: the lane's new holder took it after this process let it go,
  // so its batch takes them.
  if (LeftSetPending()) TakeLaneAndCarry(send, /*final=*/true);
  NudgeOnePending();  // a waiting owner carries the next batch
}

bool StoreCombiner::AnyLaneLooksAfter() const {
  for (const std::atomic<uint32_t>& carrying : shared_->carrying) {
    if (carrying.load() == kCarryingLooksAfter) return true;
  }
  return false;
}

bool StoreCombiner::LeftSetPending() const {
  int used = shared_->slots_used.load();
  for (int i = 0; i < used; ++i) {
    uint32_t state = shared_->state[i].load();
    if ((state == kPending || state == kNudged) && shared_->left_set[i].load() != 0) return true;
  }
  return false;
}

void StoreCombiner::CarryPending(int lane, const SendBatch& send) {
  v1::StoreRequest request;
  v1::StoreBatchRequest* batch = request.mutable_batch();
  std::vector<int> taken;
  int used = shared_->slots_used.load();
  for (int i = 0; i < used; ++i) {
    uint32_t seen = shared_->state[i].load();
    while ((seen == kPending || seen == kNudged) && !shared_->state[i].compare_exchange_weak(seen, kTaken + lane)) {
    }
    if (seen != kPending && seen != kNudged) continue;
    AddToBatch(shared_->slots[i], static_cast<uint64_t>(i), *batch);
    taken.push_back(i);
  }
  if (taken.empty()) return;
  batches_carried_.fetch_add(1, std::memory_order_relaxed);
  ops_carried_.fetch_add(static_cast<int64_t>(taken.size()), std::memory_order_relaxed);
  absl::StatusOr<v1::StoreResponse> answered = SendCatching(send, std::move(request));
  absl::Status failed = BatchStatus(answered);
  absl::flat_hash_map<uint64_t, const v1::StoreResponse*> by_slot;
  if (failed.ok()) {
    for (const v1::StoreResponse& r : answered->batch()) by_slot[r.id()] = &r;
  }
  for (int i : taken) {
    OpSlot& slot = shared_->slots[i];
    auto it = by_slot.find(static_cast<uint64_t>(i));
    if (!failed.ok()) {
      Answer(slot, failed, nullptr, /*carried_failure=*/true);
    } else if (it == by_slot.end()) {
      Answer(slot, absl::InternalError("the coordinator's answer to a node's batch left one of its operations out"));
    } else {
      Answer(slot, StatusOf(*it->second), it->second);
    }
    shared_->state[i].store(kDone);
    if (i != slot_) FutexWake(&shared_->state[i]);
  }
}

void StoreCombiner::FailOrphans(int lane) {
  int used = shared_->slots_used.load();
  for (int i = 0; i < used; ++i) {
    if (shared_->state[i].load() != kTaken + static_cast<uint32_t>(lane)) continue;
    Answer(shared_->slots[i],
           absl::UnavailableError("the rank of this node that carried this store operation to the coordinator died "
                                  "with it in flight; it may or may not have been applied"),
           nullptr, /*carried_failure=*/true);
    shared_->state[i].store(kDone);
    FutexWake(&shared_->state[i]);
  }
}

bool StoreCombiner::LanesStuck() const {
  int64_t now = MonotonicNowNs();
  for (const std::atomic<int64_t>& since : shared_->carried_since_ns) {
    int64_t taken = since.load(std::memory_order_relaxed);
    if (taken == 0 || absl::Nanoseconds(now - taken) < go_alone_after_) return false;
  }
  return true;
}

int StoreCombiner::pending() const {
  int used = shared_->slots_used.load();
  int n = 0;
  for (int i = 0; i < used; ++i) {
    uint32_t state = shared_->state[i].load();
    n += state == kPending || state == kNudged;
  }
  return n;
}

void StoreCombiner::NudgeOnePending() {
  // From the slot after this one, so that no slot is always nudged first.
  int used = shared_->slots_used.load();
  for (int k = 1; k <= used; ++k) {
    int i = (slot_ + k) % used;
    uint32_t pending = kPending;
    if (!shared_->state[i].compare_exchange_strong(pending, kNudged)) continue;
    // A left set has nobody to wake: put it back (unless a carrier took it meanwhile).
    if (shared_->left_set[i].load() != 0) {
      uint32_t nudged = kNudged;
      shared_->state[i].compare_exchange_strong(nudged, kPending);
      continue;
    }
    FutexWake(&shared_->state[i]);
    return;
  }
}

}  // namespace dt
