// File-system work of the coordinator (verifying and publishing checkpoints, removing aborted
// rounds and retired checkpoints, writing run.json, SQLite writes of metrics and periodic
// progress), done off the run locks, the RPC threads and the timer thread: on NFS or Lustre one
// unlink can take seconds, a disk under writeback pressure stalls a commit as long, and the
// health check takes every run's lock. The caller decides under its lock what to do and posts it here.
//
// Work posted under one key (a run id, or a run's checkpoint publications) runs in the order
// posted, one task at a time, so a retention pass never races the publication of the next
// checkpoint of that run; different keys run in parallel on a small, fixed number of threads.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace dt {

class FileWorkQueue {
 public:
  explicit FileWorkQueue(int threads);
  ~FileWorkQueue();  // runs what was posted, then joins
  FileWorkQueue(const FileWorkQueue&) = delete;
  FileWorkQueue& operator=(const FileWorkQueue&) = delete;

  void Post(const std::string& key, std::function<void()> task);
  // Returns once every task posted before the call has run (and any posted meanwhile).
  void Drain();

 private:
  void Work();

  absl::Mutex mu_;
  // Tasks not yet started, by key; a key is in `ready_` at most once, and not while one of its
  // tasks runs.
  absl::flat_hash_map<std::string, std::deque<std::function<void()>>> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ready_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> running_ ABSL_GUARDED_BY(mu_);
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace dt
