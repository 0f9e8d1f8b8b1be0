// Metric ingestion and history.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/metric_points.h"
#include "common/names.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/request_checks.h"

namespace dt {
absl::Status Coordinator::IngestMetrics(v1::MetricBatch batch, MetricsStored stored) {
  size_t bytes = batch.ByteSizeLong();
  if (bytes > kMaxMetricBatchBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("metric batch of ", bytes, " bytes exceeds the limit of ",
                                                     kMaxMetricBatchBytes, " (1 MiB); send smaller batches"));
  }
  if (absl::Status s = ValidateMetricPoints(batch); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(batch.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  {
    // Shutdown drains the file work: a stream fed without end would keep it from returning.
    absl::MutexLock lock(&registry_mu_);
    if (shutting_down_) {
      return absl::UnavailableError("the coordinator is shutting down; send the batch again to its replacement");
    }
  }
  {
    RunMutexLock lock(&run->mu);
    const v1::Run& r = run->stored.run;
    int world = WorldSize(r.spec());
    if (batch.rank() < 0 || batch.rank() >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", batch.rank(), " is outside 0..", world - 1, " of run ", r.run_id()));
    }
    // Points of an ended generation are still real history (a trainer flushing as it exits).
    if (batch.generation() > r.generation() || batch.generation() < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("generation ", batch.generation(), " of run ", r.run_id(), " does not exist"));
    }
  }
  // Charged until delivered: what a run makes the coordinator hold is bounded per run.
  const int64_t charge = static_cast<int64_t>(bytes);
  int64_t held = run->metric_bytes_held.fetch_add(charge) + charge;
  if (held > options_.metric_bytes_per_run) {
    run->metric_bytes_held.fetch_sub(charge);
    return absl::ResourceExhaustedError(absl::StrCat(
        "run ", batch.run_id(), " has ", held - charge, " bytes of metric batches waiting to be stored; this batch of ",
        charge, " would pass the limit of ", options_.metric_bytes_per_run,
        " per run (dtcoord --metric-bytes-per-run): the coordinator's disk is behind, send it again shortly"));
  }
  metrics_->Accept(std::move(run), std::move(batch), std::move(stored), charge);
  return absl::OkStatus();
}

int64_t Coordinator::MetricBatchesUnstored() const { return metrics_->Unstored(); }

void Coordinator::WhenMetricsDelivered(std::function<void()> then) { metrics_->WhenDelivered(std::move(then)); }

void Coordinator::DeliverMetrics(RunEntry& run, const v1::MetricBatch& batch,
                                 const std::vector<RunObserver*>& observers) {
  Deferred deferred;
  std::shared_ptr<const v1::Run> observed;
  {
    RunMutexLock lock(&run.mu);
    for (auto& [id, watcher] : run.watchers) {
      if (!watcher.metrics) continue;
      WatchCallback cb = watcher.callback;
      ForEachMetricPoint(batch, [&](const MetricPointView& p) {
        WatchUpdate update;
        update.event.emplace();
        v1::MetricPointEvent* m = update.event->mutable_metric();
        m->set_rank(batch.rank());
        m->set_step(p.step);
        m->set_time(p.time);
        for (const auto& [name, value] : p.values) (*m->mutable_values())[std::string(name)] = value;
        deferred.Add([cb, update = std::move(update)] { cb(update); });
      });
    }
    observed = run.observed;
  }
  for (RunObserver* o : observers) o->OnMetrics(*observed, batch);
}

absl::StatusOr<v1::QueryMetricsResponse> Coordinator::QueryMetrics(const v1::QueryMetricsRequest& request) {
  if (absl::Status s = ValidateQueryMetricsRequest(request); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  StateDb::MetricQuery query;
  query.run_id = request.run_id();
  query.name = request.name();
  if (request.has_rank()) query.rank = request.rank();
  query.from_step = request.from_step();
  if (request.has_after()) query.after = request.after();
  query.limit = request.limit() == 0 ? kMaxMetricRecordsPerQuery : request.limit();
  absl::StatusOr<StateDb::MetricPage> page = db_->QueryMetrics(query);
  if (!page.ok()) return page.status();
  v1::QueryMetricsResponse out;
  for (auto& rec : page->records) *out.add_records() = std::move(rec);
  if (page->more && page->next) *out.mutable_next() = *page->next;
  return out;
}

}  // namespace dt
