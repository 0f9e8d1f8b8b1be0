// The shared memory that the ranks of one node map together: one POSIX segment per (kind, run,
// generation, node). The node relay (barrier outcomes) and the store combiner (store adds) each
// keep their state in one; this file owns what they share: naming, creation by the first opener,
// the wait for its initialisation, the removal of earlier generations' segments, and the removal
// of the name once every rank of the node has it mapped (nothing is left in /dev/shm).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <pthread.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dt {

class NodeSegment {
 public:
  // Opens (creating when first) the `bytes`-sized segment of `kind` for `run_id`'s `generation`
  // on `node`. The creator runs `initialise` on the zeroed memory before any other opener may use
  // it, and removes this run's segments of `kind` from earlier generations on this node (their
  // ranks are gone). `layout_version` is part of the name, so a program built with another layout
  // (a user's, linked against an older client library) never maps this one. Fails when shared
  // memory cannot be used here; the caller then goes without.
  static absl::StatusOr<std::unique_ptr<NodeSegment>> Open(const std::string& kind, int layout_version,
                                                           const std::string& run_id, int64_t generation,
                                                           const std::string& node, size_t bytes, int ranks_on_node,
                                                           const std::function<void(void*)>& initialise);
  ~NodeSegment();
  NodeSegment(const NodeSegment&) = delete;
  NodeSegment& operator=(const NodeSegment&) = delete;

  // The `bytes` the caller asked for.
  void* data() const { return data_; }
  // The segment's name under /dev/shm.
  const std::string& name() const { return name_; }
  // As the creator said; and how many openers have mapped it so far.
  int ranks_on_node() const;
  int attached() const;

  // Removes the segment's name (processes that have it open keep using it).
  void Unlink();

  struct Header;

 private:
  NodeSegment() = default;
  std::string name_;
  Header* header_ = nullptr;
  void* data_ = nullptr;
  size_t mapped_ = 0;
};

// What the users of a segment synchronise with, across processes.
// A process-shared, robust mutex: a process killed while holding it does not block the node (the
// next locker gets EOWNERDEAD and takes it over).
void InitSharedRobustMutex(pthread_mutex_t* mu);
// Wakes every process waiting on `word`; waits while `word` holds `expected`, up to `timeout`.
void FutexWake(std::atomic<uint32_t>* word);
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

}  // namespace dt
