#include "coordinator/request_checks.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/names.h"
#include "common/node_registration.h"
#include "common/utf8.h"

namespace dt {
namespace {

// What a node's registration shares among its slots.
absl::Status ValidateNodeAndHost(const std::string& node, const std::string& host) {
  if (absl::Status s = ValidateLabel("node", node); !s.ok()) return s;
  return ValidateLabel("host", host);
}

// What each slot (process) of a registration has of its own.
absl::Status ValidateSlotFields(const v1::RegisterRequest& request) {
  if (absl::Status s = ValidateLabel("incarnation", request.incarnation()); !s.ok()) return s;
  if (request.pid() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pid must not be negative, not ", request.pid()));
  }
  if (request.local_slot() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("local slot must not be negative, not ", request.local_slot()));
  }
  if (request.has_scheduler_task() && (request.scheduler_task() < 0 || request.scheduler_task() >= kMaxWorldSize)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler task must be within 0..", kMaxWorldSize - 1, ", not ", request.scheduler_task()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTimeoutMs(int64_t timeout_ms) {
  if (timeout_ms < 0 || timeout_ms > kMaxWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms must be within 0..", kMaxWaitMs, " (0: the run's default), not ", timeout_ms));
  }
  return absl::OkStatus();
}

absl::Status ValidateRegisterRequest(const v1::RegisterRequest& request) {
  if (absl::Status s = ValidateNodeAndHost(request.node(), request.host()); !s.ok()) return s;
  return ValidateSlotFields(request);
}

absl::StatusOr<std::vector<v1::RegisterRequest>> NodeSlotRequests(const v1::RegisterNodeRequest& request) {
  if (request.slots().empty() || request.slots_size() > kMaxRanksPerNodeCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("a node registers 1..", kMaxRanksPerNodeCall, " slots, not ", request.slots_size()));
  }
  // The node's own fields first, once, so a fault in them is not blamed on a slot.
  if (absl::Status s = ValidateNodeAndHost(request.node(), request.host()); !s.ok()) return s;
  std::vector<v1::RegisterRequest> slots;
  slots.reserve(request.slots_size());
  absl::flat_hash_set<int> seen;
  for (int i = 0; i < request.slots_size(); ++i) {
    v1::RegisterRequest& slot = slots.emplace_back(SlotRegistration(request, i));
    if (absl::Status s = ValidateSlotFields(slot); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", slot.local_slot(), ": ", s.message()));
    }
    if (!seen.insert(slot.local_slot()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot.local_slot(), " is given twice; each process has its own slot"));
    }
  }
  return slots;
}

absl::Status ValidateRankHeartbeat(const v1::RankHeartbeat& beat) {
  if (beat.step() < 0 || beat.total_steps() < 0) {
    return absl::InvalidArgumentError("step and total steps must not be negative");
  }
  if (beat.worker_pid() < 0) return absl::InvalidArgumentError("worker pid must not be negative");
  if (beat.idle_ms() < 0) return absl::InvalidArgumentError("idle time must not be negative");
  return absl::OkStatus();
}

absl::Status ValidateNodeHeartbeatRequest(const v1::NodeHeartbeatRequest& request) {
  if (request.ranks().empty() || request.ranks_size() > kMaxRanksPerNodeCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("a node heartbeat carries 1..", kMaxRanksPerNodeCall, " ranks, not ", request.ranks_size()));
  }
  absl::flat_hash_set<int> seen;
  for (const v1::RankHeartbeat& beat : request.ranks()) {
    if (absl::Status s = ValidateRankHeartbeat(beat); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", beat.rank(), ": ", s.message()));
    }
    if (!seen.insert(beat.rank()).second) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", beat.rank(), " is given twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateReportErrorRequest(const v1::ReportErrorRequest& request) {
  if (request.rank() < -1) return absl::InvalidArgumentError("rank must be ≥ -1");
  if (request.local_slot() < -1) return absl::InvalidArgumentError("local slot must be ≥ -1");
  if (request.has_scheduler_task()) {
    if (request.rank() != -1) {
      return absl::InvalidArgumentError("give either a rank or a scheduler task (with rank -1), not both");
    }
    if (request.scheduler_task() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler task must not be negative, not ", request.scheduler_task()));
    }
    if (!request.node().empty()) {
      if (absl::Status s = ValidateLabel("node", request.node()); !s.ok()) return s;
    }
  } else if (request.rank() == -1) {
    if (absl::Status s = ValidateLabel("node", request.node()); !s.ok()) return s;
  }
  if (request.message().empty()) return absl::InvalidArgumentError("error message must not be empty");
  return absl::OkStatus();
}

absl::Status ValidateReportPreflightRequest(const v1::ReportPreflightRequest& request) {
  const v1::DevicePreflight& result = request.result();
  const double most = absl::ToDoubleSeconds(kMaxPreflightTime);
  for (auto [name, seconds] : {std::pair{"matmul_seconds", result.matmul_seconds()},
                               std::pair{"allreduce_seconds", result.allreduce_seconds()}}) {
    if (!std::isfinite(seconds) || seconds < 0 || seconds > most) {
      return absl::InvalidArgumentError(
          absl::StrCat("pre-flight ", name, " must be within 0..", most, ", not ", seconds));
    }
  }
  if (result.matmul_size() < 0 || result.matmul_size() > kMaxPreflightMatmulSize) {
    return absl::InvalidArgumentError(absl::StrCat("pre-flight matmul_size must be within 0..", kMaxPreflightMatmulSize,
                                                   ", not ", result.matmul_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateBarrierRequest(const v1::BarrierRequest& request) {
  if (absl::Status s = ValidateTimeoutMs(request.timeout_ms()); !s.ok()) return s;
  if (absl::StartsWith(request.name(), "dt.") && request.name() != "dt.data-ready") {
    // dt's own barriers (checkpoint rounds) must not be joined by name from outside.
    return absl::InvalidArgumentError(
        absl::StrCat("barrier name \"", request.name(), "\" is reserved: names starting with \"dt.\" belong to dt"));
  }
  return absl::OkStatus();
}

absl::Status ValidateBeginCheckpointRequest(const v1::BeginCheckpointRequest& request) {
  if (request.step() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step must be positive, not ", request.step()));
  }
  return ValidateTimeoutMs(request.timeout_ms());
}

absl::Status ValidateExcludeNodesRequest(const v1::ExcludeNodesRequest& request) {
  if (request.nodes().empty()) return absl::InvalidArgumentError("no nodes to exclude");
  if (request.nodes_size() > kMaxExcludeNodesPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.nodes_size(), " nodes in one call; at most ", kMaxExcludeNodesPerCall));
  }
  for (const v1::FailedNode& n : request.nodes()) {
    if (absl::Status s = ValidateNodeName(n.node()); !s.ok()) return s;
    if (n.evidence().size() > kMaxNodeEvidenceBytes || !IsValidUtf8(n.evidence())) {
      return absl::InvalidArgumentError(absl::StrCat("the evidence for node ", n.node(), " is not UTF-8 of at most ",
                                                     kMaxNodeEvidenceBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAttachLaunchRequest(const v1::AttachLaunchRequest& request) {
  if (request.launcher_host().empty()) return absl::OkStatus();
  return ValidateLabel("launcher host", request.launcher_host());
}

absl::Status ValidateCancelReason(const std::string& reason) {
  if (reason.size() > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cancel reason is longer than ", kMaxMessageBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace dt
