// MetricsService: the client-streamed metric batches and history queries.
#include <functional>

#include "common/limits.h"
#include "common/metric_points.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/services.h"

namespace dt {
namespace {

// Reads a stream's batches while up to kMetricBatchesInFlightPerStream of them (and
// kMetricBytesInFlightPerStream) wait for storage, which runs on the file-work threads; ends OK
// once every batch is stored and delivered (Prometheus, the W&B spool): the client does not send
// again what an OK stream carried. The stream finishes only once nothing is in flight, so no
// storage callback outlives the reactor, and with the first error any batch met.
class MetricsReader : public grpc::ServerReadReactor<v1::MetricBatch> {
 public:
  MetricsReader(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, v1::ReportMetricsResponse* out)
      : deps_(deps), ctx_(ctx), out_(out), timer_(deps, "ReportMetrics") {
    absl::StatusOr<Principal> who = deps_.auth->Authenticate(*ctx_);
    if (!who.ok()) {
      Done(who.status());
      return;
    }
    who_ = *who;
    out_->set_accepts_columns(true);
    absl::MutexLock lock(&mu_);
    reading_ = true;
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side (or the stream is finishing)
      Then then;
      {
        absl::MutexLock lock(&mu_);
        reading_ = false;
        closed_ = true;
        then = FinishIfIdle();
      }
      if (then) then();  // last: finishing may delete this reactor
      return;
    }
    int64_t points = 0;
    int64_t bytes = 0;
    absl::Status accepted;
    Then then;
    {
      // reading_ stays set until this batch is handed over: batch_ is not free before then.
      absl::MutexLock lock(&mu_);
      if (closed_) {  // an error is ending the stream: this batch is not taken
        reading_ = false;
        return;
      }
      if (accepted = Coordinator::Authorize(who_, batch_.run_id()); !accepted.ok()) {
        reading_ = false;
        then = Fail(accepted);
      } else {
        points = MetricPointCount(batch_);
        bytes = static_cast<int64_t>(batch_.ByteSizeLong());
        ++in_flight_;
        in_flight_bytes_ += bytes;
      }
    }
    if (!accepted.ok()) {
      if (then) then();  // last: finishing may delete this reactor
      return;
    }
    accepted = deps_.coordinator->metrics().Ingest(std::move(batch_), [this, points, bytes](const absl::Status& s) {
      Then then;
      {
        absl::MutexLock lock(&mu_);
        --in_flight_;
        in_flight_bytes_ -= bytes;
        if (!s.ok()) {
          then = Fail(s);
        } else {
          out_->set_batches_accepted(out_->batches_accepted() + 1);
          out_->set_points_accepted(out_->points_accepted() + points);
          ReadOnIfRoom();
          then = FinishIfIdle();
        }
      }
      if (then) then();  // last: finishing may delete this reactor (never under mu_)
    });
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!accepted.ok()) {
        --in_flight_;
        in_flight_bytes_ -= bytes;
        then = Fail(accepted);
      } else {
        ReadOnIfRoom();
      }
    }
    if (then) then();
  }

  void OnCancel() override {}
  void OnDone() override { delete this; }

 private:
  // The next read starts while the stream has room for another batch in flight.
  void ReadOnIfRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || closed_) return;
    if (in_flight_ >= kMetricBatchesInFlightPerStream || in_flight_bytes_ >= kMetricBytesInFlightPerStream) return;
    reading_ = true;
    batch_.Clear();
    StartRead(&batch_);
  }

  // What to do once mu_ is released: finishing the stream may delete this reactor at once (gRPC
  // calls OnDone from its own thread), so it is never done under mu_, whose unlock would then
  // touch freed memory.
  using Then = std::function<void()>;

  // The first error ends the stream once the batches already in flight are answered.
  Then Fail(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) error_ = s;
    closed_ = true;
    return FinishIfIdle();
  }

  // With nothing in flight: an error is answered now (a read still outstanding then ends with
  // OnReadDone(false), which gRPC allows); a closed stream once its batches are delivered.
  Then FinishIfIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !closed_ || in_flight_ > 0) return nullptr;
    finished_ = true;
    if (!error_.ok()) return [this, error = error_] { Done(error); };
    return [this] { deps_.coordinator->metrics().WhenDelivered([this] { Done(absl::OkStatus()); }); };
  }

  void Done(const absl::Status& s) {
    timer_.Done(s.code());
    Finish(ToGrpcStatus(s));
  }

  ServiceDeps deps_;
  grpc::CallbackServerContext* ctx_;
  v1::ReportMetricsResponse* out_;
  RpcTimer timer_;
  Principal who_;
  v1::MetricBatch batch_;  // the read in progress: gRPC's between StartRead and OnReadDone
  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;   // batch_ is being read or handed over
  bool closed_ ABSL_GUARDED_BY(mu_) = false;    // no more batches taken: the client closed, or an error
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called, or waits behind delivery
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<v1::MetricBatch>* MetricsServiceImpl::ReportMetrics(grpc::CallbackServerContext* ctx,
                                                                            v1::ReportMetricsResponse* out) {
  return new MetricsReader(deps_, ctx, out);
}

grpc::ServerUnaryReactor* MetricsServiceImpl::QueryMetrics(grpc::CallbackServerContext* ctx,
                                                           const v1::QueryMetricsRequest* req,
                                                           v1::QueryMetricsResponse* out) {
  return ReplyForRun(deps_, ctx, "QueryMetrics", req->run_id(), out,
                     [&] { return deps_.coordinator->metrics().Query(*req); });
}

}  // namespace dt
