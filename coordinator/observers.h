// What the coordinator tells the outside about itself: run changes and metric batches (the
// Prometheus exporter and the W&B forwarder), finished RPCs, and health statistics. Every hook
// is called outside the coordinator's locks and must not block.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dt/v1/metrics.pb.h"
#include "dt/v1/runs.pb.h"

namespace dt {

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void OnRunChanged(const v1::Run& run) = 0;
  virtual void OnMetrics(const v1::Run& run, const v1::MetricBatch& batch) = 0;
  // Every batch of one delivery pass has been given to OnMetrics: an observer that buffers them
  // (the W&B spool, one write per pass) makes them durable here, before any stream that sent them
  // is told they were delivered.
  virtual void OnMetricPassEnd() {}
};

class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  virtual void OnRpcDone(const char* method, absl::StatusCode code, absl::Duration latency) = 0;
};

class CoordinatorStats {
 public:
  virtual ~CoordinatorStats() = default;
  virtual void ObserveBarrierWait(absl::Duration waited) = 0;
  virtual void ObserveCheckpointRound(bool committed, absl::Duration took, int64_t bytes) = 0;
  virtual void CountHeartbeatMiss() = 0;
};

// The W&B forwarder's figures, exported by Prometheus.
class ForwarderStats {
 public:
  virtual ~ForwarderStats() = default;
  virtual void SetWandbQueue(int64_t points) = 0;
  virtual void CountWandbRequest(int http_code) = 0;  // 0: no response (connection error)
  virtual void CountDroppedPoints(const char* reason, int64_t points) = 0;
};

}  // namespace dt
