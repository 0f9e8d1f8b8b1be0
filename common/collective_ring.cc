#include "common/collective_ring.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/proto_time.h"

namespace dt {

CollectiveRing& CollectiveRing::Process() {
  static CollectiveRing* ring = new CollectiveRing();
  return *ring;
}

uint64_t CollectiveRing::Begin(absl::string_view op, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t sequence = next_++;
  Entry e{sequence, std::string(op), bytes, absl::Now()};
  if (entries_.size() < kCapacity) {
    entries_.push_back(std::move(e));
  } else {
    entries_[(sequence - 1) % kCapacity] = std::move(e);
  }
  return sequence;
}

void CollectiveRing::End(uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (sequence == 0 || sequence >= next_ || next_ - sequence > kCapacity) return;  // long gone
  Entry& e = entries_[(sequence - 1) % kCapacity];
  if (e.sequence == sequence) e.ended = absl::Now();
}

std::vector<v1::CollectiveRecord> CollectiveRing::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> ordered;
  for (const Entry& e : entries_) ordered.push_back(&e);
  std::sort(ordered.begin(), ordered.end(), [](const Entry* a, const Entry* b) { return a->sequence < b->sequence; });
  std::vector<v1::CollectiveRecord> out;
  for (const Entry* e : ordered) {
    v1::CollectiveRecord& r = out.emplace_back();
    r.set_sequence(static_cast<int64_t>(e->sequence));
    r.set_op(e->op);
    r.set_bytes(e->bytes);
    *r.mutable_started() = ToProtoTime(e->started);
    if (e->ended != absl::InfiniteFuture()) *r.mutable_ended() = ToProtoTime(e->ended);
  }
  return out;
}

}  // namespace dt
