// MetricsService: the client-streamed metric batches and history queries.
#include "coordinator/services.h"

namespace dt {
namespace {

// Stores each batch before reading the next, and ends OK once every batch is also delivered
// (Prometheus, the W&B spool): the client does not send again what an OK stream carried.
// Storage completes on a file-work thread, which resumes the stream.
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
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side: every batch was stored, and soon delivered
      deps_.coordinator->WhenMetricsDelivered([this] { Done(absl::OkStatus()); });
      return;
    }
    if (absl::Status s = Coordinator::Authorize(who_, batch_.run_id()); !s.ok()) {
      Done(s);
      return;
    }
    int points = batch_.points_size();
    // The next read waits until this batch is stored; storage runs off this (polling) thread.
    absl::Status accepted = deps_.coordinator->IngestMetrics(std::move(batch_), [this, points](const absl::Status& s) {
      if (!s.ok()) {
        Done(s);
        return;
      }
      out_->set_batches_accepted(out_->batches_accepted() + 1);
      out_->set_points_accepted(out_->points_accepted() + points);
      batch_.Clear();
      StartRead(&batch_);
    });
    if (!accepted.ok()) Done(accepted);
  }

  void OnCancel() override {}
  void OnDone() override { delete this; }

 private:
  void Done(const absl::Status& s) {
    timer_.Done(s.code());
    Finish(ToGrpcStatus(s));
  }

  ServiceDeps deps_;
  grpc::CallbackServerContext* ctx_;
  v1::ReportMetricsResponse* out_;
  RpcTimer timer_;
  Principal who_;
  v1::MetricBatch batch_;
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
                     [&] { return deps_.coordinator->QueryMetrics(*req); });
}

}  // namespace dt
