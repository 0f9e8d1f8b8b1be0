// Metric ingestion (metric_pipeline.h): the batch checked on the RPC thread, stored and delivered on
// the file work; the history read from the state database.
#include "coordinator/metric_pipeline.h"

#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/metric_points.h"
#include "common/names.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/file_work.h"
#include "coordinator/request_checks.h"
#include "coordinator/state_db.h"

namespace dt {
namespace {

// Deliveries run one at a time, in the order their passes were stored.
constexpr char kMetricDeliveryKey[] = "metric delivery";

}  // namespace

absl::Status Coordinator::MetricPipeline::Ingest(v1::MetricBatch batch, MetricsStored stored) {
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
    absl::MutexLock lock(&coordinator_.registry_mu_);
    if (coordinator_.shutting_down_) {
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
  if (held > coordinator_.options_.metric_bytes_per_run) {
    run->metric_bytes_held.fetch_sub(charge);
    return absl::ResourceExhaustedError(absl::StrCat(
        "run ", batch.run_id(), " has ", held - charge, " bytes of metric batches waiting to be stored; this batch of ",
        charge, " would pass the limit of ", coordinator_.options_.metric_bytes_per_run,
        " per run (dtcoord --metric-bytes-per-run): the coordinator's disk is behind, send it again shortly"));
  }
  Accept(std::move(run), std::move(batch), std::move(stored), charge);
  return absl::OkStatus();
}

void Coordinator::MetricPipeline::Deliver(RunEntry& run, const v1::MetricBatch& batch,
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

absl::StatusOr<v1::QueryMetricsResponse> Coordinator::MetricPipeline::Query(const v1::QueryMetricsRequest& request) {
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
  absl::StatusOr<StateDb::MetricPage> page = coordinator_.db_->QueryMetrics(query);
  if (!page.ok()) return page.status();
  v1::QueryMetricsResponse out;
  for (auto& rec : page->records) *out.add_records() = std::move(rec);
  if (page->more && page->next) *out.mutable_next() = *page->next;
  return out;
}

void Coordinator::MetricPipeline::Accept(RunPtr run, v1::MetricBatch batch, MetricsStored stored, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  waiting_.push_back(Waiting{std::move(run), std::move(batch), std::move(stored), bytes});
  ++unstored_;
  if (!pass_posted_) {
    pass_posted_ = true;
    // One key: passes run one at a time, in order, beside other runs' checkpoint work.
    coordinator_.file_work_->Post("metric storage", [this] { StorePass(); });
  }
}

int64_t Coordinator::MetricPipeline::Unstored() const {
  absl::MutexLock lock(&mu_);
  return unstored_;
}

void Coordinator::MetricPipeline::WhenDelivered(std::function<void()> then) {
  coordinator_.file_work_->Post(kMetricDeliveryKey, std::move(then));
}

void Coordinator::MetricPipeline::StorePass() {
  if (coordinator_.options_.before_metric_pass) coordinator_.options_.before_metric_pass();
  std::vector<Waiting> pass;
  {
    absl::MutexLock lock(&mu_);
    pass.swap(waiting_);
    pass_posted_ = false;  // what arrives from now on waits for the next pass
  }
  std::vector<StateDb::MetricAppend> appends;
  appends.reserve(pass.size());
  for (const Waiting& w : pass) appends.push_back(StateDb::MetricAppend{&w.batch.run_id(), w.batch.rank(), &w.batch});
  absl::Status status = coordinator_.db_->AppendMetricBatches(appends);
  // A stream's batch leaves its window of batches in flight once stored, so storage and delivery
  // overlap: waiting for delivery as well left each stream one whole hand-over behind (metric
  // ingest 41k -> 51k points/s here). While more than kMaxUndeliveredBatches wait for
  // delivery, the streams wait for it too, which bounds the memory a slow observer (a W&B spool
  // on a busy disk) can make batches hold. (A stream still ends OK only after delivery.)
  bool resume_now;
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) undelivered_ += static_cast<int64_t>(pass.size());
    resume_now = !status.ok() || undelivered_ <= kMaxUndeliveredBatches;
  }
  std::vector<MetricsStored> resumed;
  if (resume_now) {
    for (Waiting& w : pass) resumed.push_back(std::exchange(w.stored, nullptr));
  }
  // Delivery is a second stage, so the next pass commits while this one reaches Prometheus, W&B
  // (a spool append) and the streams; one key keeps the passes in order. Posted before the
  // streams resume: a stream that then ends waits for it (WhenDelivered).
  auto delivered = std::make_shared<std::vector<Waiting>>(std::move(pass));
  coordinator_.file_work_->Post(kMetricDeliveryKey, [this, delivered, status] { DeliverPass(*delivered, status); });
  for (MetricsStored& stored : resumed) stored(status);
}

void Coordinator::MetricPipeline::DeliverPass(std::vector<Waiting>& pass, const absl::Status& status) {
  if (status.ok()) {
    const std::vector<RunObserver*> observers = coordinator_.Observers();
    for (Waiting& w : pass) Deliver(*w.run, w.batch, observers);
    for (RunObserver* o : observers) o->OnMetricPassEnd();
  }
  for (Waiting& w : pass) {
    w.run->metric_bytes_held.fetch_sub(w.bytes);
    {
      absl::MutexLock lock(&mu_);
      --unstored_;
      if (status.ok()) --undelivered_;
    }
    if (w.stored) w.stored(status);
  }
}

}  // namespace dt
