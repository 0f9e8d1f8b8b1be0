// Metric batches from their acceptance to their delivery, and their history. A storage pass writes every batch
// waiting in one SQLite transaction on the file work, off the RPC threads and the run locks; the
// pass's delivery to the run's watchers and the observers (Prometheus, the W&B spool) follows
// under a key of its own, so the next pass commits while this one is delivered.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class Coordinator::MetricPipeline : private ManagerBase {
 public:
  explicit MetricPipeline(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // ---- MetricsService and the console ----
  // Validates `batch` and queues it for storage, which runs on the file-work threads, many
  // batches to one SQLite transaction: a disk that stalls writes (dirty-page writeback, a busy
  // file system) must hold neither the RPC threads nor the run's lock that heartbeats take.
  // `stored` runs once the batch is in the state database (OK), or storing failed (INTERNAL);
  // delivery to watchers and observers follows, and while more than kMaxUndeliveredBatches wait
  // for it, `stored` waits for the batch's delivery too. It is not called when validation refuses
  // the batch, whose error is returned: RESOURCE_EXHAUSTED (over 1 MiB, or the run's batches
  // waiting for storage and delivery would pass --metric-bytes-per-run: send it again later),
  // INVALID_ARGUMENT (negative step, non-finite time, bad metric name, rank outside the world),
  // NOT_FOUND (run), FAILED_PRECONDITION (generation that does not exist), UNAVAILABLE (shutting
  // down).
  absl::Status Ingest(v1::MetricBatch batch, MetricsStored stored);
  // A page of a run's stored points (QueryMetrics): INVALID_ARGUMENT, NOT_FOUND (run), INTERNAL
  // (the state database).
  absl::StatusOr<v1::QueryMetricsResponse> Query(const v1::QueryMetricsRequest& request);
  // Runs `then` (on a file-work thread) once every batch whose `stored` ran before this call is
  // delivered to watchers and observers: a stream ends OK only once its points were handed to
  // Prometheus and the W&B spool, so a coordinator killed afterwards has not lost points that the
  // client will never send again (what a failing spool append drops is counted as dropped).
  void WhenDelivered(std::function<void()> then);
  // Batches accepted and not yet stored and delivered (takes no run lock).
  int64_t Unstored() const;
  // Stored batches waiting for delivery beyond which a batch's `stored` waits for its delivery.
  static constexpr int64_t kMaxUndeliveredBatches = 256;

 private:
  // Queues a batch Ingest has checked, charged `bytes` to its run's metric_bytes_held until it
  // is delivered, and posts a storage pass unless one is waiting.
  void Accept(RunPtr run, v1::MetricBatch batch, MetricsStored stored, int64_t bytes);
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
  // Hands a stored batch to the run's metric watchers and to `observers` (Prometheus, W&B).
  void Deliver(RunEntry& run, const v1::MetricBatch& batch, const std::vector<RunObserver*>& observers);

  mutable absl::Mutex mu_;
  std::vector<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  bool pass_posted_ ABSL_GUARDED_BY(mu_) = false;
  int64_t unstored_ ABSL_GUARDED_BY(mu_) = 0;     // accepted, not yet delivered
  int64_t undelivered_ ABSL_GUARDED_BY(mu_) = 0;  // stored, not yet delivered
};

}  // namespace dt
