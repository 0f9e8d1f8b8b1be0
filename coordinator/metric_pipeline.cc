#include "coordinator/metric_pipeline.h"

#include <memory>
#include <utility>

#include "coordinator/coordinator_internal.h"
#include "coordinator/file_work.h"
#include "coordinator/state_db.h"

namespace dt {
namespace {

// Deliveries run one at a time, in the order their passes were stored.
constexpr char kMetricDeliveryKey[] = "metric delivery";

}  // namespace

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
  // ingest 41k -> 51k points/s here). While more than kMaxUndeliveredMetricBatches wait for
  // delivery, the streams wait for it too, which bounds the memory a slow observer (a W&B spool
  // on a busy disk) can make batches hold. (A stream still ends OK only after delivery.)
  bool resume_now;
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) undelivered_ += static_cast<int64_t>(pass.size());
    resume_now = !status.ok() || undelivered_ <= kMaxUndeliveredMetricBatches;
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
  std::vector<RunObserver*> observers;
  if (status.ok()) observers = coordinator_.Observers();
  for (Waiting& w : pass) {
    if (status.ok()) coordinator_.DeliverMetrics(*w.run, w.batch, observers);
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
