// srun's own account of a job step that ended badly, for the run's root cause. With
// --kill-on-bad-exit srun stops the other tasks only after one failed, and prints each task's end
// as it learns of it ("srun: error: n2: task 1: Killed"): its first such line names the task that
// failed first. The sbatch script keeps srun's stderr and `dtctl report-step` sends that line to
// the coordinator, which maps the task id to a rank (trainers register with SLURM_PROCID).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/coordinator_client.h"

namespace dt::ctl {

struct SrunTaskEnd {
  std::string nodes;       // "n2", or a host list such as "n[1-2]"
  std::vector<int> tasks;  // "task 1" → {1}; "tasks 0-2,5" → {0, 1, 2, 5}
  std::string what;        // "Killed", "Exited with exit code 3", "Segmentation fault (core dumped)"
  std::string line;        // the line as srun printed it
};

// Every "srun: error: NODES: task(s) LIST: WHAT" line of srun's stderr, in order.
std::vector<SrunTaskEnd> ParseSrunTaskEnds(const std::string& srun_stderr);

// The last "srun: error: ..." line that is not a task's end (e.g. "Unable to create step ..."),
// or empty: what to report when srun failed before any task did.
std::string LastSrunError(const std::string& srun_stderr);

// What `dtctl report-step` sends: the first task that failed, by its task id (the node only when
// srun named one node), or — srun failed before any task did — srun's own error against the node
// the batch script runs on. nullopt when there is nothing to report (srun ended with code 0).
std::optional<v1::ReportErrorRequest> StepFailureReport(const std::string& run_id, int64_t generation, int exit_code,
                                                        const std::string& srun_stderr, const std::string& batch_node);

}  // namespace dt::ctl
