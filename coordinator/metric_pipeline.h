// Metric batches between their acceptance and their delivery. A storage pass writes every batch
// waiting in one SQLite transaction on the file work, off the RPC threads and the run locks; the
// pass's delivery to the run's watchers and the observers (Prometheus, the W&B spool) follows
// under a key of its own, so the next pass commits while this one is delivered.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class Coordinator::MetricPipeline : private ManagerBase {
 public:
  explicit MetricPipeline(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // Queues a batch IngestMetrics has checked, charged `bytes` to its run's metric_bytes_held
  // until it is delivered, and posts a storage pass unless one is waiting. `stored` runs as
  // IngestMetrics says.
  void Accept(RunPtr run, v1::MetricBatch batch, MetricsStored stored, int64_t bytes);
  // Batches accepted and not yet stored and delivered.
  int64_t Unstored() const;
  // Runs `then` on the delivery key: after every pass posted for delivery before this call.
  void WhenDelivered(std::function<void()> then);

 private:
  struct Waiting {
    RunPtr run;
    v1::MetricBatch batch;
    MetricsStored stored;
    int64_t bytes = 0;  // charged to the run's metric_bytes_held until delivered
  };
  // One storage pass: everything waiting, in one transaction.
  void StorePass();
  // The pass's delivery, after `status` of its storage; releases each batch's charge and counts.
  void DeliverPass(std::vector<Waiting>& pass, const absl::Status& status);

  mutable absl::Mutex mu_;
  std::vector<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  bool pass_posted_ ABSL_GUARDED_BY(mu_) = false;
  int64_t unstored_ ABSL_GUARDED_BY(mu_) = 0;     // accepted, not yet delivered
  int64_t undelivered_ ABSL_GUARDED_BY(mu_) = 0;  // stored, not yet delivered
};

}  // namespace dt
