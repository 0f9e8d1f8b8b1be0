#include "coordinator/request_checks.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/limits.h"
#include "common/names.h"
#include "common/node_registration.h"
#include "common/procs_per_node.h"
#include "common/run_env.h"
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
  if (!request.launcher_host().empty()) {
    if (absl::Status s = ValidateLabel("launcher host", request.launcher_host()); !s.ok()) return s;
  }
  if (request.batch_host().empty()) return absl::OkStatus();
  if (absl::Status s = ValidateNodeName(request.batch_host()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("batch host: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ValidateCancelReason(const std::string& reason) {
  if (reason.size() > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cancel reason is longer than ", kMaxMessageBytes, " bytes"));
  }
  return absl::OkStatus();
}

namespace {

// The run's size: nodes, processes per node (or the rule that counts them) and the world.
absl::Status ValidateRunShape(const v1::RunSpec& spec) {
  if (spec.nodes() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nodes must be at least 1, not ", spec.nodes()));
  }
  if (absl::Status s = ValidateProcsPerNodeRule(spec.procs_per_node_rule()); !s.ok()) return s;
  bool counted_on_nodes = spec.procs_per_node() == 0 && !spec.procs_per_node_rule().empty();
  if (counted_on_nodes && spec.exec_command_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("processes per node ", Quote(spec.procs_per_node_rule()),
                     " can be counted on the nodes only by dtrun (an --exec run); a dttrainer run takes a count"));
  }
  if (!counted_on_nodes && spec.procs_per_node() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("procs per node must be at least 1, not ", spec.procs_per_node()));
  }
  if (spec.min_nodes() != 0) {
    if (spec.min_nodes() < 1 || spec.min_nodes() >= spec.nodes()) {
      return absl::InvalidArgumentError(absl::StrCat("min nodes must be within 1..", spec.nodes() - 1,
                                                     " (below the run's ", spec.nodes(),
                                                     " nodes), or 0 for a fixed "
                                                     "world, not ",
                                                     spec.min_nodes()));
    }
    if (spec.scheduler() != v1::LOCAL && spec.scheduler() != v1::SLURM) {
      return absl::InvalidArgumentError(
          "min nodes (an elastic run, --nodes MIN:MAX) is offered for runs dtctl launches (local or Slurm): "
          "with another launcher nothing places the next generation on the nodes that remain; give --nodes a "
          "single count");
    }
  }
  int64_t world = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node();
  if (world > kMaxWorldSize) {
    return absl::ResourceExhaustedError(absl::StrCat("world size ", spec.nodes(), " × ", spec.procs_per_node(), " = ",
                                                     world, " exceeds the limit of ", kMaxWorldSize));
  }
  return absl::OkStatus();
}

absl::Status ValidatePolicyCount(absl::string_view field, int64_t value, int64_t least) {
  if (value < least || value > kMaxPolicyCount) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be within ", least, "..", kMaxPolicyCount, ", not ", value));
  }
  return absl::OkStatus();
}

// What the run does when things go wrong: requeues, restarts, idle and hang limits, retention.
absl::Status ValidateRunPolicies(const v1::RunSpec& spec) {
  if (absl::Status s = ValidatePolicyCount("max requeues", spec.max_requeues(), 0); !s.ok()) return s;
  if (absl::Status s = ValidatePolicyCount("max restarts", spec.max_restarts(), 0); !s.ok()) return s;
  if (spec.has_idle_timeout_ms() &&
      (spec.idle_timeout_ms() < 0 || spec.idle_timeout_ms() > absl::ToInt64Milliseconds(kMaxIdleTimeout))) {
    return absl::InvalidArgumentError(absl::StrCat("idle timeout must be within 0 (off) and ",
                                                   absl::FormatDuration(kMaxIdleTimeout), ", not ",
                                                   spec.idle_timeout_ms(), " ms"));
  }
  if (spec.has_max_identical_hangs()) {
    if (absl::Status s = ValidatePolicyCount("max identical hangs", spec.max_identical_hangs(), 1); !s.ok()) return s;
  }
  return ValidatePolicyCount("keep checkpoints", spec.keep_checkpoints(), 0);
}

absl::Status ValidateWords(absl::string_view what, const google::protobuf::RepeatedPtrField<std::string>& words) {
  if (static_cast<size_t>(words.size()) > kMaxTrainerArgs) {
    return absl::InvalidArgumentError(absl::StrCat(words.size(), " ", what, "s exceed the limit of ", kMaxTrainerArgs));
  }
  for (const std::string& word : words) {
    if (word.size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quote(word), " is longer than ", kMaxPathBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// What runs: dttrainer's arguments or the --exec command, and sbatch's arguments.
absl::Status ValidateRunCommand(const v1::RunSpec& spec) {
  if (absl::Status s = ValidateWords("trainer argument", spec.trainer_args()); !s.ok()) return s;
  if (absl::Status s = ValidateWords("--exec command word", spec.exec_command()); !s.ok()) return s;
  if (spec.exec_command_size() > 0 && spec.exec_command(0).empty()) {
    return absl::InvalidArgumentError("the --exec command's program is empty");
  }
  if (absl::Status s = ValidateWords("sbatch argument", spec.sbatch_args()); !s.ok()) return s;
  if (!spec.trainer_path().empty()) {
    if (absl::Status s = ValidateAbsolutePath("trainer path", spec.trainer_path()); !s.ok()) return s;
  }
  return ValidateRunEnv(spec.env());
}

// What describes the run: W&B settings, the join key, labels.
absl::Status ValidateRunMetadata(const v1::RunSpec& spec) {
  if (!spec.wandb().base_url().empty()) {
    return absl::InvalidArgumentError(
        "a run cannot choose the W&B server: the coordinator's API key goes only where its operator points it "
        "(dtcoord's WANDB_BASE_URL); leave wandb.base_url empty");
  }
  const std::string& mode = spec.wandb().mode();
  if (!mode.empty() && mode != "online" && mode != "offline" && mode != "disabled") {
    return absl::InvalidArgumentError(
        absl::StrCat("W&B mode ", Quote(mode), " is not one of online, offline, disabled"));
  }
  if (!spec.join_key().empty()) {
    if (absl::Status s = ValidateLabel("join key", spec.join_key()); !s.ok()) return s;
  }
  if (spec.labels_size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("a run has at most ", kMaxLabels, " labels, not ", spec.labels_size()));
  }
  for (const auto& [k, v] : spec.labels()) {
    if (absl::Status s = ValidateLabel("label name", k); !s.ok()) return s;
    if (v.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", Quote(k), " is ", v.size(),
                                                     " bytes long; a label's value has at most ", kMaxLabelValueBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRunSpec(const v1::RunSpec& spec) {
  if (absl::Status s = ValidateExperimentName(spec.experiment_name()); !s.ok()) return s;
  if (absl::Status s = ValidateAbsolutePath("save dir", spec.save_dir()); !s.ok()) return s;
  if (absl::Status s = ValidateRunShape(spec); !s.ok()) return s;
  if (absl::Status s = ValidateRunPolicies(spec); !s.ok()) return s;
  if (absl::Status s = ValidateRunCommand(spec); !s.ok()) return s;
  return ValidateRunMetadata(spec);
}

absl::Status ValidateReportStoppedRequest(const v1::ReportStoppedRequest& request) {
  if (request.signal() < 1 || request.signal() > kMaxSignal) {
    return absl::InvalidArgumentError(
        absl::StrCat("signal must be within 1..", kMaxSignal, ", not ", request.signal()));
  }
  if (request.step() < 0) return absl::InvalidArgumentError("step must not be negative");
  return absl::OkStatus();
}

absl::Status ValidateLeaveRequest(const v1::LeaveRequest& request) {
  if (request.final_step() < 0) return absl::InvalidArgumentError("final step must not be negative");
  if (request.signal() < 0 || request.signal() > kMaxSignal) {
    return absl::InvalidArgumentError(
        absl::StrCat("signal must be within 0..", kMaxSignal, ", not ", request.signal()));
  }
  return absl::OkStatus();
}

absl::Status ValidateReportStacksRequest(const v1::ReportStacksRequest& request) {
  if (request.capture_id().empty() || request.capture_id().size() > kMaxNameChars) {
    return absl::InvalidArgumentError(absl::StrCat("capture id must be 1..", kMaxNameChars, " characters"));
  }
  if (request.stacks().processes_size() > kMaxCaptureProcesses) {
    return absl::InvalidArgumentError(absl::StrCat("a rank's capture holds at most ", kMaxCaptureProcesses,
                                                   " processes, not ", request.stacks().processes_size()));
  }
  if (request.stacks().ByteSizeLong() > kMaxCaptureBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a rank's capture holds at most ", kMaxCaptureBytes,
                                                   " bytes of stacks, not ", request.stacks().ByteSizeLong()));
  }
  return absl::OkStatus();
}

absl::Status ValidateQueryMetricsRequest(const v1::QueryMetricsRequest& request) {
  if (request.limit() < 0 || request.limit() > kMaxMetricRecordsPerQuery) {
    return absl::InvalidArgumentError(absl::StrCat("limit ", request.limit(), " is outside 0..",
                                                   kMaxMetricRecordsPerQuery,
                                                   " (0: one full page); page through longer histories with `after`"));
  }
  if (!request.name().empty()) {
    if (absl::Status s = ValidateMetricName(request.name()); !s.ok()) return s;
  }
  if (request.has_after() && !request.after().name().empty()) {
    if (absl::Status s = ValidateMetricName(request.after().name()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateGetStacksRequest(const v1::GetStacksRequest& request) {
  if (request.has_generation() && request.generation() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("generation must not be negative, not ", request.generation()));
  }
  if (request.limit() < 0 || request.limit() > kMaxStackCapturesPerQuery) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit must be within 0..", kMaxStackCapturesPerQuery, ", not ", request.limit()));
  }
  return absl::OkStatus();
}

}  // namespace dt
