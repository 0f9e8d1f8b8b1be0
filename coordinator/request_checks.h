// Each RPC's checks of its request's own fields, made before any run is looked up: one place to
// read what a caller may send. Checks that need the run (its ranks, its scheduler, its state) stay
// with the run's logic. The limits are in common/limits.h. Each returns INVALID_ARGUMENT naming the
// field, the limit and the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dt/v1/barrier.pb.h"
#include "dt/v1/checkpoint.pb.h"
#include "dt/v1/metrics.pb.h"
#include "dt/v1/rendezvous.pb.h"
#include "dt/v1/runs.pb.h"
#include "dt/v1/stacks.pb.h"

namespace dt {

// A wait a caller asks for: 0 (the run's default) up to kMaxWaitMs.
absl::Status ValidateTimeoutMs(int64_t timeout_ms);
absl::Status ValidateRegisterRequest(const v1::RegisterRequest& request);
// The RegisterRequest each slot of a RegisterNode stands for, in order, checked as
// ValidateRegisterRequest checks one (the message names the slot): 1..1,024 slots, none twice.
absl::StatusOr<std::vector<v1::RegisterRequest>> NodeSlotRequests(const v1::RegisterNodeRequest& request);
// One rank's heartbeat: no negative step, total, pid or idle time.
absl::Status ValidateRankHeartbeat(const v1::RankHeartbeat& beat);
// Every rank's heartbeat, 1..1,024 ranks, none twice.
absl::Status ValidateNodeHeartbeatRequest(const v1::NodeHeartbeatRequest& request);
absl::Status ValidateReportErrorRequest(const v1::ReportErrorRequest& request);
absl::Status ValidateReportPreflightRequest(const v1::ReportPreflightRequest& request);
absl::Status ValidateBarrierRequest(const v1::BarrierRequest& request);
absl::Status ValidateBeginCheckpointRequest(const v1::BeginCheckpointRequest& request);
absl::Status ValidateExcludeNodesRequest(const v1::ExcludeNodesRequest& request);
absl::Status ValidateAttachLaunchRequest(const v1::AttachLaunchRequest& request);
absl::Status ValidateCancelReason(const std::string& reason);
// A submission's spec: names, paths, the run's size (the world at most kMaxWorldSize, else
// RESOURCE_EXHAUSTED), its policies, its command and environment, W&B settings and labels.
absl::Status ValidateRunSpec(const v1::RunSpec& spec);
// A stop's signal (1..kMaxSignal) and step; a leaving rank's final step and signal (0: none).
absl::Status ValidateReportStoppedRequest(const v1::ReportStoppedRequest& request);
absl::Status ValidateLeaveRequest(const v1::LeaveRequest& request);
// One rank's stacks (a capture id, at most kMaxCaptureProcesses processes and kMaxCaptureBytes);
// a query of captures (generation not negative, up to kMaxStackCapturesPerQuery).
absl::Status ValidateReportStacksRequest(const v1::ReportStacksRequest& request);
absl::Status ValidateGetStacksRequest(const v1::GetStacksRequest& request);
// A metrics query: up to kMaxMetricRecordsPerQuery records, metric names well formed.
absl::Status ValidateQueryMetricsRequest(const v1::QueryMetricsRequest& request);

}  // namespace dt
