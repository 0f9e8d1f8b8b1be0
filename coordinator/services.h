// The gRPC services of dtcoord. Each translates RPCs into Coordinator calls; the contracts (status
// codes per RPC) are documented in proto/dt/v1/*.proto.
#pragma once

#include <functional>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

#include "coordinator/reactors.h"
#include "dt/v1/barrier.grpc.pb.h"
#include "dt/v1/checkpoint.grpc.pb.h"
#include "dt/v1/experiment.grpc.pb.h"
#include "dt/v1/metrics.grpc.pb.h"
#include "dt/v1/rendezvous.grpc.pb.h"
#include "dt/v1/runs.grpc.pb.h"
#include "dt/v1/stacks.grpc.pb.h"
#include "dt/v1/store.grpc.pb.h"

namespace dt {

class RunServiceImpl final : public v1::RunService::CallbackService {
 public:
  explicit RunServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerUnaryReactor* SubmitRun(grpc::CallbackServerContext* ctx, const v1::SubmitRunRequest* req,
                                      v1::SubmitRunResponse* out) override;
  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* ctx, const v1::GetRunRequest* req,
                                   v1::Run* out) override;
  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx, const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* out) override;
  grpc::ServerUnaryReactor* CancelRun(grpc::CallbackServerContext* ctx, const v1::CancelRunRequest* req,
                                      v1::Run* out) override;
  grpc::ServerUnaryReactor* AttachLaunch(grpc::CallbackServerContext* ctx, const v1::AttachLaunchRequest* req,
                                         v1::Run* out) override;
  grpc::ServerUnaryReactor* ExcludeNodes(grpc::CallbackServerContext* ctx, const v1::ExcludeNodesRequest* req,
                                         v1::Run* out) override;
  grpc::ServerWriteReactor<v1::RunEvent>* WatchRun(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchRunRequest* req) override;

 private:
  ServiceDeps deps_;
};

class RendezvousServiceImpl final : public v1::RendezvousService::CallbackService {
 public:
  explicit RendezvousServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const v1::RegisterRequest* req,
                                     v1::RegisterResponse* out) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* out) override;
  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx, const v1::RegisterNodeRequest* req,
                                         v1::RegisterNodeResponse* out) override;
  grpc::ServerUnaryReactor* NodeHeartbeat(grpc::CallbackServerContext* ctx, const v1::NodeHeartbeatRequest* req,
                                          v1::NodeHeartbeatResponse* out) override;
  grpc::ServerBidiReactor<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>* NodeHeartbeats(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ReportError(grpc::CallbackServerContext* ctx, const v1::ReportErrorRequest* req,
                                        v1::ReportErrorResponse* out) override;
  grpc::ServerUnaryReactor* ReportStopped(grpc::CallbackServerContext* ctx, const v1::ReportStoppedRequest* req,
                                          v1::ReportStoppedResponse* out) override;
  grpc::ServerUnaryReactor* ReportPreflight(grpc::CallbackServerContext* ctx, const v1::ReportPreflightRequest* req,
                                            v1::ReportPreflightResponse* out) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* out) override;

 private:
  ServiceDeps deps_;
};

class StoreServiceImpl final : public v1::StoreService::CallbackService {
 public:
  // `features`: what its sessions accept beyond the stream's first version, and say so in their
  // answer to `open` (every feature of this build, unless serving as an older coordinator).
  StoreServiceImpl(ServiceDeps deps, v1::StoreSessionFeatures features) : deps_(deps), features_(std::move(features)) {}
  grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>* Session(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const v1::StoreSetRequest* req,
                                v1::StoreSetResponse* out) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const v1::StoreGetRequest* req,
                                v1::StoreGetResponse* out) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const v1::StoreAddRequest* req,
                                v1::StoreAddResponse* out) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx, const v1::StoreCompareSetRequest* req,
                                       v1::StoreCompareSetResponse* out) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const v1::StoreCheckRequest* req,
                                  v1::StoreCheckResponse* out) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::StoreWaitRequest* req,
                                 v1::StoreWaitResponse* out) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* ctx, const v1::StoreDeleteKeyRequest* req,
                                      v1::StoreDeleteKeyResponse* out) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx, const v1::StoreNumKeysRequest* req,
                                    v1::StoreNumKeysResponse* out) override;

  // Ends every open session with `status` (UNAVAILABLE on shutdown). A session stays open for its
  // client's life; without this a draining server waits its whole grace period for them while
  // its listening socket takes connections it never serves.
  void CloseSessions(const absl::Status& status);

  // Open sessions, each by the function that ends it.
  struct Sessions {
    absl::Mutex mu;
    uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
    absl::flat_hash_map<uint64_t, std::function<void(const absl::Status&)>> closers ABSL_GUARDED_BY(mu);
  };

 private:
  ServiceDeps deps_;
  v1::StoreSessionFeatures features_;
  std::shared_ptr<Sessions> sessions_ = std::make_shared<Sessions>();
};

class BarrierServiceImpl final : public v1::BarrierService::CallbackService {
 public:
  explicit BarrierServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                    v1::BarrierResponse* out) override;

 private:
  ServiceDeps deps_;
};

class ExperimentServiceImpl final : public v1::ExperimentService::CallbackService {
 public:
  explicit ExperimentServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerUnaryReactor* GetExperiment(grpc::CallbackServerContext* ctx, const v1::GetExperimentRequest* req,
                                          v1::Experiment* out) override;

 private:
  ServiceDeps deps_;
};

class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {
 public:
  explicit CheckpointServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerUnaryReactor* BeginCheckpoint(grpc::CallbackServerContext* ctx, const v1::BeginCheckpointRequest* req,
                                            v1::BeginCheckpointResponse* out) override;
  grpc::ServerUnaryReactor* CommitCheckpoint(grpc::CallbackServerContext* ctx, const v1::CommitCheckpointRequest* req,
                                             v1::CommitCheckpointResponse* out) override;
  grpc::ServerUnaryReactor* AbortCheckpoint(grpc::CallbackServerContext* ctx, const v1::AbortCheckpointRequest* req,
                                            v1::AbortCheckpointResponse* out) override;
  grpc::ServerUnaryReactor* LatestCheckpoint(grpc::CallbackServerContext* ctx, const v1::LatestCheckpointRequest* req,
                                             v1::CheckpointInfo* out) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* req,
                                            v1::ListCheckpointsResponse* out) override;

 private:
  ServiceDeps deps_;
};

class MetricsServiceImpl final : public v1::MetricsService::CallbackService {
 public:
  explicit MetricsServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerReadReactor<v1::MetricBatch>* ReportMetrics(grpc::CallbackServerContext* ctx,
                                                          v1::ReportMetricsResponse* out) override;
  grpc::ServerUnaryReactor* QueryMetrics(grpc::CallbackServerContext* ctx, const v1::QueryMetricsRequest* req,
                                         v1::QueryMetricsResponse* out) override;

 private:
  ServiceDeps deps_;
};

class StacksServiceImpl final : public v1::StacksService::CallbackService {
 public:
  explicit StacksServiceImpl(ServiceDeps deps) : deps_(deps) {}
  grpc::ServerUnaryReactor* ReportStacks(grpc::CallbackServerContext* ctx, const v1::ReportStacksRequest* req,
                                         v1::ReportStacksResponse* out) override;
  grpc::ServerUnaryReactor* CaptureStacks(grpc::CallbackServerContext* ctx, const v1::CaptureStacksRequest* req,
                                          v1::StackCapture* out) override;
  grpc::ServerUnaryReactor* GetStacks(grpc::CallbackServerContext* ctx, const v1::GetStacksRequest* req,
                                      v1::GetStacksResponse* out) override;

 private:
  ServiceDeps deps_;
};

}  // namespace dt
