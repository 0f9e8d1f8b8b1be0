// Runs started by the user's own sbatch script (no `dtctl submit`): the tasks of one Slurm job
// create or join the same run, keyed by experiment and job id. Used by dttrainer and dtrun.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace dt {

struct JoinRunSpec {
  std::string experiment_name;
  std::string save_dir;
  int nodes = 0;
  int procs_per_node = 0;
  int max_restarts = 0;
  std::vector<std::string> trainer_args;  // dttrainer's command line, recorded with the run
  std::vector<std::string> exec_command;  // dtrun: the user's program
  std::string procs_per_node_rule;        // dtrun: gpu|cpu|auto with procs_per_node 0 (each node counts)
};

// The run id. The join key is "<experiment>@slurm-<SLURM_JOB_ID>" ("@slurm-none" outside Slurm).
absl::StatusOr<std::string> CreateOrJoinRun(CoordinatorClient& client, const JoinRunSpec& spec);

}  // namespace dt
