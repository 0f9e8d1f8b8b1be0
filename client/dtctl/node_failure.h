// Which nodes failed under a run: the batch script of a job Slurm requeued (a node failure ends the
// job NODE_FAIL, and a --requeue job goes back to the queue) asks Slurm about the nodes the run's
// ranks last ran on. A node counts as failed only with Slurm's evidence — down, failing, drained or
// not responding, or its slurmd started again after the run last heard of its ranks — so a node
// whose ranks merely went quiet with the others is never excluded.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dt/v1/runs.pb.h"

namespace dt::ctl {

// One node as `scontrol show node -o NAME` describes it.
struct SlurmNode {
  std::string name;
  std::string state;   // e.g. IDLE, ALLOCATED, DOWN+NOT_RESPONDING, IDLE+DRAIN
  std::string reason;  // empty when none
  std::optional<absl::Time> slurmd_started;
};
SlurmNode ParseSlurmNode(absl::string_view line);

// The nodes to ask Slurm about — those of the run's latest ranks and of its heartbeat-timeout
// failures, less those already excluded — each with the last time the run heard from it.
std::map<std::string, absl::Time> SuspectNodes(const v1::Run& run);

// Slurm's evidence that `node` failed after `last_heard`, in words; nullopt when there is none.
std::optional<std::string> NodeFailureEvidence(const SlurmNode& node, absl::Time last_heard);

}  // namespace dt::ctl
