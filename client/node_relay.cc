#include "client/node_relay.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <new>

#include "absl/strings/str_cat.h"
#include "client/node_segment.h"
#include "common/utf8.h"

namespace dt {
namespace {

constexpr int kSlots = 64;
constexpr size_t kMessageBytes = 1024;
// Members whose arrival a slot holds back for the node's last arrival to carry.
constexpr int kMaxHeldBack = 64;
// A published outcome nobody read for this long is abandoned (its readers gave up): reusable.
constexpr int64_t kAbandonedAfterSeconds = 600;

}  // namespace

struct Slot {
  uint64_t key;                     // 0: free; else the barrier instance's. Under the segment's mutex,
  std::atomic<uint32_t> published;  // but this futex word: 1 once the outcome is in place
  int32_t arrived;                  // ranks of the node that took this slot (holder + members)
  int32_t readers_left;             // from publication: members that have not read the outcome
  int32_t code;
  uint64_t sequence;
  int64_t published_at_s;
  uint32_t message_len;
  char message[kMessageBytes];
  int32_t held_back_count;  // members whose arrival is not yet sent (the last arrival carries them)
  int32_t held_back[kMaxHeldBack];
};

struct NodeRelay::Segment {
  std::atomic<uint32_t> epoch;  // bumped by InterruptWaiters
  pthread_mutex_t mu;           // process-shared and robust: a rank killed while holding it does not block the node
  Slot slots[kSlots];
};

namespace {

class SegmentLock {
 public:
  explicit SegmentLock(pthread_mutex_t* mu) : mu_(mu) {
    if (pthread_mutex_lock(mu_) == EOWNERDEAD) pthread_mutex_consistent(mu_);
  }
  ~SegmentLock() { pthread_mutex_unlock(mu_); }

 private:
  pthread_mutex_t* mu_;
};

// In the segment's name, so that builds with another layout never map this one (a user's program
// linked against an older client library on the same node goes without a relay instead).
constexpr int kLayoutVersion = 3;

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void FreeSlot(Slot& slot) {
  slot.key = 0;
  slot.published.store(0, std::memory_order_relaxed);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeRelay>> NodeRelay::Open(const std::string& run_id, int64_t generation,
                                                           const std::string& node, int ranks_on_node) {
  absl::StatusOr<std::unique_ptr<NodeSegment>> shared = NodeSegment::Open(
      "relay", kLayoutVersion, run_id, generation, node, sizeof(Segment), ranks_on_node, [](void* memory) {
        Segment* seg = new (memory) Segment();
        InitSharedRobustMutex(&seg->mu);
      });
  if (!shared.ok()) return shared.status();
  std::unique_ptr<NodeRelay> relay(new NodeRelay());
  relay->shared_ = std::move(*shared);
  relay->segment_ = static_cast<Segment*>(relay->shared_->data());
  return relay;
}

NodeRelay::~NodeRelay() = default;

const std::string& NodeRelay::name() const { return shared_->name(); }

void NodeRelay::InterruptWaiters() {
  segment_->epoch.fetch_add(1, std::memory_order_acq_rel);
  for (Slot& slot : segment_->slots) FutexWake(&slot.published);
}

void NodeRelay::Unlink() { shared_->Unlink(); }

namespace {
uint64_t SlotKey(const std::string& name, uint64_t sequence) { return Fnv1a(absl::StrCat(name, "#", sequence)) | 1; }
}  // namespace

int NodeRelay::ArrivedAt(const std::string& name, uint64_t sequence) const {
  uint64_t key = SlotKey(name, sequence);
  SegmentLock lock(&segment_->mu);
  for (const Slot& slot : segment_->slots) {
    if (slot.key == key) return slot.arrived;
  }
  return 0;
}

NodeRelay::Ticket NodeRelay::Arrive(const std::string& name, uint64_t sequence, int rank) {
  uint64_t key = SlotKey(name, sequence);
  int64_t now_s = absl::ToUnixSeconds(absl::Now());
  SegmentLock lock(&segment_->mu);
  int free_slot = -1;
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = segment_->slots[i];
    if (slot.key == key) {
      ++slot.arrived;
      Ticket member{Role::kMember, i};
      if (slot.published.load(std::memory_order_relaxed) == 1) {
        // Came after the publication (a failed instance): one more reader before the slot is free.
        ++slot.readers_left;
        return member;
      }
      // Every rank of the node uses this relay: hold the arrival back for the node's last arrival,
      // which then sends all of them in one message.
      int ranks_on_node = shared_->ranks_on_node();
      bool whole_node = shared_->attached() >= ranks_on_node;
      if (whole_node && slot.arrived == ranks_on_node) {
        member.carry.assign(slot.held_back, slot.held_back + slot.held_back_count);
        slot.held_back_count = 0;
      } else if (whole_node && slot.held_back_count < kMaxHeldBack) {
        slot.held_back[slot.held_back_count++] = rank;
        member.held_back = true;
      }
      return member;
    }
    bool abandoned = slot.key != 0 && slot.published.load(std::memory_order_relaxed) == 1 &&
                     now_s - slot.published_at_s > kAbandonedAfterSeconds;
    if (free_slot < 0 && (slot.key == 0 || abandoned)) free_slot = i;
  }
  if (free_slot < 0) return Ticket{Role::kDirect, -1};
  Slot& slot = segment_->slots[free_slot];
  slot.key = key;
  slot.published.store(0, std::memory_order_relaxed);
  slot.arrived = 1;
  slot.readers_left = 0;
  slot.code = 0;
  slot.sequence = 0;
  slot.message_len = 0;
  slot.held_back_count = 0;
  return Ticket{Role::kHolder, free_slot};
}

bool NodeRelay::SendHeldBack(const Ticket& ticket, int rank) {
  if (!ticket.held_back) return false;
  Slot& slot = segment_->slots[ticket.slot];
  SegmentLock lock(&segment_->mu);
  int32_t* end = slot.held_back + slot.held_back_count;
  int32_t* it = std::find(slot.held_back, end, rank);
  if (it == end) return false;  // the node's last arrival carried it
  *it = end[-1];
  --slot.held_back_count;
  return true;
}

void NodeRelay::Publish(const Ticket& ticket, const RelayOutcome& outcome) {
  Slot& slot = segment_->slots[ticket.slot];
  {
    SegmentLock lock(&segment_->mu);
    slot.code = static_cast<int32_t>(outcome.status.code());
    std::string message = TruncateUtf8(outcome.status.message(), kMessageBytes);
    slot.message_len = static_cast<uint32_t>(message.size());
    std::memcpy(slot.message, message.data(), message.size());
    slot.sequence = outcome.sequence;
    slot.published_at_s = absl::ToUnixSeconds(absl::Now());
    slot.readers_left = slot.arrived - 1;
    if (slot.readers_left <= 0) {
      FreeSlot(slot);
      return;
    }
    slot.published.store(1, std::memory_order_release);
  }
  FutexWake(&slot.published);
}

absl::StatusOr<RelayOutcome> NodeRelay::Wait(const Ticket& ticket, absl::Time deadline, const std::string& what,
                                             const std::function<absl::Status()>& interrupted, absl::Duration poll) {
  Slot& slot = segment_->slots[ticket.slot];
  uint32_t epoch = segment_->epoch.load(std::memory_order_acquire);
  while (true) {
    if (slot.published.load(std::memory_order_acquire) == 1) {
      RelayOutcome out;
      SegmentLock lock(&segment_->mu);
      out.sequence = slot.sequence;
      if (slot.code != 0) {
        out.status =
            absl::Status(static_cast<absl::StatusCode>(slot.code), std::string(slot.message, slot.message_len));
      }
      if (--slot.readers_left <= 0) FreeSlot(slot);
      return out;
    }
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what,
          ": the first rank of this node to arrive (which hears from the coordinator) published no outcome in "
          "time; did it die?"));
    }
    if (segment_->epoch.load(std::memory_order_acquire) != epoch) {
      return absl::UnavailableError(
          absl::StrCat(what, ": a rank of this node lost its store session to the coordinator; arriving again"));
    }
    if (absl::Status s = interrupted(); !s.ok()) return s;
    FutexWait(&slot.published, 0, std::min(poll, deadline - now));
  }
}

}  // namespace dt
