#include "client/metrics_reporter.h"

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/metric_points.h"

namespace dt {

MetricsReporter::MetricsReporter(std::shared_ptr<CoordinatorClient> client, std::string run_id, int64_t generation,
                                 int rank, absl::Duration flush_interval)
    : client_(std::move(client)),
      run_id_(std::move(run_id)),
      generation_(generation),
      rank_(rank),
      flush_interval_(flush_interval) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsReporter::~MetricsReporter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  if (absl::Status s = SendQueued(absl::Seconds(5)); !s.ok()) {
    DT_LOG(Warning) << "metrics not delivered at exit: " << s.message();
  }
}

void MetricsReporter::Add(int64_t step, const std::map<std::string, double>& values, double unix_time) {
  {
    absl::MutexLock lock(&mu_);
    // More values for the step still queued: one point per step.
    if (queue_.size() > in_flight_ && queue_.back().step() == step) {
      for (const auto& [k, v] : values) (*queue_.back().mutable_values())[k] = v;
      return;
    }
  }
  v1::MetricPoint p;
  p.set_step(step);
  p.set_time(unix_time >= 0 ? unix_time : absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  p.mutable_values()->insert(values.begin(), values.end());
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(p));
}

void MetricsReporter::Summary(const std::map<std::string, double>& values) {
  absl::MutexLock lock(&mu_);
  for (const auto& [k, v] : values) summary_[k] = v;
}

int64_t MetricsReporter::delivered() const {
  absl::MutexLock lock(&mu_);
  return delivered_;
}

void MetricsReporter::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), flush_interval_);
      if (stopping_) return;
    }
    absl::Status s = SendQueued(flush_interval_ * 5);
    absl::MutexLock lock(&mu_);
    if (!s.ok() && last_error_.ok()) {
      DT_LOG(Warning) << "metrics not delivered yet (" << s.message()
                      << "): they are kept and sent again; training goes on";
    }
    last_error_ = s;
  }
}

absl::Status MetricsReporter::Flush(absl::Duration timeout) { return SendQueued(timeout); }

absl::Status MetricsReporter::SendQueued(absl::Duration timeout) {
  absl::MutexLock sending(&send_mu_);
  std::vector<v1::MetricBatch> batches;
  size_t taken = 0;
  {
    absl::MutexLock lock(&mu_);
    if (queue_.empty() && summary_.empty()) return absl::OkStatus();
    std::vector<const v1::MetricPoint*> group;
    size_t group_bytes = 0;
    const bool as_columns = coordinator_reads_columns_;
    auto close_batch = [&] {
      v1::MetricBatch& batch = batches.emplace_back();
      batch.set_run_id(run_id_);
      batch.set_generation(generation_);
      batch.set_rank(rank_);
      // Columns once the coordinator said it reads them (far cheaper for both sides).
      std::optional<v1::MetricColumns> columns;
      if (as_columns) columns = ToMetricColumns(group);
      if (columns) {
        *batch.mutable_columns() = std::move(*columns);
      } else {
        for (const v1::MetricPoint* p : group) *batch.add_points() = *p;
      }
      group.clear();
      group_bytes = 0;
    };
    for (const auto& p : queue_) {
      // Stay well under the coordinator's 1 MiB batch limit (columns are no larger than points
      // whose names mostly repeat; ToMetricColumns keeps the others as points).
      size_t bytes = p.ByteSizeLong() + 8;
      if (!group.empty() && group_bytes + bytes > kMaxMetricBatchBytes / 2) close_batch();
      group.push_back(&p);
      group_bytes += bytes;
      ++taken;
    }
    close_batch();  // the last, perhaps with no points: it carries the summary
    batches.back().mutable_summary()->insert(summary_.begin(), summary_.end());
    in_flight_ = taken;
  }
  std::unique_ptr<grpc::ClientContext> ctx = client_->Context(timeout);
  v1::ReportMetricsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::MetricBatch>> writer = client_->metrics().ReportMetrics(ctx.get(), &response);
  for (const auto& b : batches) {
    if (!writer->Write(b)) break;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  absl::MutexLock lock(&mu_);
  in_flight_ = 0;
  if (!status.ok()) return FromCallStatus(status);
  if (response.accepts_columns()) coordinator_reads_columns_ = true;
  // Only what was sent is dropped; points added meanwhile stay queued.
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(taken));
  delivered_ += static_cast<int64_t>(taken);
  if (!batches.empty() && !batches.back().summary().empty()) {
    for (const auto& [k, v] : batches.back().summary()) {
      auto it = summary_.find(k);
      if (it != summary_.end() && it->second == v) summary_.erase(it);
    }
  }
  return absl::OkStatus();
}

}  // namespace dt
