// The rank's recent collectives, for the hang verdict: "ranks 0-6 wait in all-reduce #1042 (started
// 41 s ago); rank 7 last finished #1041". dttrainer records each collective it issues (sequence
// number in its process group, operation, bytes, start and end); a stack capture reads the ring
// from another thread while the rank is stuck. Every rank issues the same collectives in the same
// order, so the sequence numbers line up across ranks. Thread-safe; one per process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dt/v1/stacks.pb.h"

namespace dt {

class CollectiveRing {
 public:
  static constexpr size_t kCapacity = 64;

  // The process's ring.
  static CollectiveRing& Process();

  // A collective was issued: its sequence number (1, 2, ...).
  uint64_t Begin(absl::string_view op, int64_t bytes);
  // The caller's wait for collective `sequence` returned.
  void End(uint64_t sequence);
  // The ring, oldest first; a record without `ended` is still waited for.
  std::vector<v1::CollectiveRecord> Snapshot() const;

 private:
  struct Entry {
    uint64_t sequence = 0;
    std::string op;
    int64_t bytes = 0;
    absl::Time started;
    absl::Time ended = absl::InfiniteFuture();
  };
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // a ring of kCapacity
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace dt
