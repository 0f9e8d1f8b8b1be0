// Batches a trainer's metric points and streams them to the coordinator from a thread, so
// reporting never blocks a training step. A batch that could not be delivered is sent again
// (the coordinator replaces a point with the same rank, step and names, so nothing is doubled).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"

namespace dt {

class MetricsReporter {
 public:
  MetricsReporter(std::shared_ptr<CoordinatorClient> client, std::string run_id, int64_t generation, int rank,
                  absl::Duration flush_interval = absl::Seconds(1));
  ~MetricsReporter();  // flushes (up to 5 s)

  void Add(int64_t step, const std::map<std::string, double>& values, double unix_time = -1);
  void Summary(const std::map<std::string, double>& values);
  // Sends everything queued and waits until the coordinator stored and delivered it (Prometheus,
  // the W&B spool), or `timeout`.
  absl::Status Flush(absl::Duration timeout);

  int64_t delivered() const;

 private:
  void Loop();
  absl::Status SendQueued(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  std::shared_ptr<CoordinatorClient> client_;
  std::string run_id_;
  int64_t generation_;
  int rank_;
  absl::Duration flush_interval_;
  mutable absl::Mutex mu_;
  absl::Mutex send_mu_;  // one sender at a time
  std::deque<v1::MetricPoint> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> summary_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // points at the front of queue_ being sent
  // The coordinator answered a stream with accepts_columns: later batches go as columns.
  bool coordinator_reads_columns_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dt
