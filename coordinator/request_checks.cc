#include "coordinator/request_checks.h"

#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/names.h"
#include "common/utf8.h"

namespace dt {
namespace {

absl::Status ValidateIdentity(const std::string& node, const std::string& incarnation, const std::string& host,
                              int pid) {
  if (absl::Status s = ValidateLabel("node", node); !s.ok()) return s;
  if (absl::Status s = ValidateLabel("incarnation", incarnation); !s.ok()) return s;
  if (absl::Status s = ValidateLabel("host", host); !s.ok()) return s;
  if (pid < 0) return absl::InvalidArgumentError(absl::StrCat("pid must not be negative, not ", pid));
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
  if (absl::Status s = ValidateIdentity(request.node(), request.incarnation(), request.host(), request.pid());
      !s.ok()) {
    return s;
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
