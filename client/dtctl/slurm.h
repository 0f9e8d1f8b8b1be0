// dtctl's Slurm side: render deploy/slurm/dt.sbatch.tmpl into a 0600 script that carries the run
// token, submit it with `sbatch --parsable`, ask squeue about the job, cancel it with scancel.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dt::ctl {

struct SbatchParams {
  std::string job_name;
  int nodes = 1;
  int min_nodes = 0;  // > 0: an elastic run (--no-kill; each step on the generation's nodes)
  int tasks_per_node = 1;
  int cpus_per_task = 0;      // 0: Slurm's default
  int preempt_grace_s = 120;  // #SBATCH --signal=USR2@<this>
  int gpus_per_node = 0;
  std::string logs_dir;
  std::string exp_dir;
  std::vector<std::string> sbatch_args;  // extra "--partition=gpu" style options
  std::string coordinator;
  std::string run_id;
  std::string run_token;
  std::string tls_ca;
  int omp_threads = 1;  // 0: not exported (dtrun applies torchrun's rule)
  std::string trainer;
  std::vector<std::string> trainer_args;
  // dtrun (--exec runs) is told the step's node count (--nnodes) ahead of trainer_args.
  bool pass_step_nodes = false;
  // The run's variables, for the trainers only (not the script's own dtctl calls).
  std::map<std::string, std::string> trainer_env;
  std::string dtctl;
};

// The template: $DT_SBATCH_TEMPLATE, else <prefix>/share/dt/dt.sbatch.tmpl next to the installed
// binary, else deploy/slurm/dt.sbatch.tmpl of the source tree the binary was built in.
absl::StatusOr<std::string> FindSbatchTemplate();

// Replaces {{NAME}} placeholders; INVALID_ARGUMENT naming any placeholder left unknown.
absl::StatusOr<std::string> RenderTemplate(const std::string& text, const std::map<std::string, std::string>& values);
absl::StatusOr<std::string> RenderSbatch(const std::string& template_text, const SbatchParams& p);

// A shell word: 'single-quoted' unless it is plainly safe.
std::string ShellQuote(const std::string& word);

// Runs `sbatch --parsable SCRIPT`; returns the job id.
absl::StatusOr<std::string> SubmitBatch(const std::string& script);

struct SlurmJob {
  std::string id;
  std::string state;   // PENDING, RUNNING, COMPLETED, FAILED, NODE_FAIL, CANCELLED, ...
  std::string reason;  // the pending reason, or "None"
  std::string nodes;
};
// NOT_FOUND once Slurm forgot the job.
absl::StatusOr<SlurmJob> QueryJob(const std::string& job_id);

// `scontrol show node -o NAME`, one line; NOT_FOUND when Slurm does not know the node.
absl::StatusOr<std::string> DescribeNode(const std::string& node);
// The node names a hostlist expression stands for (n[1-3] → n1 n2 n3), by `scontrol show hostnames`.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(const std::string& hostlist);
// Keeps the job off these nodes from now on (scontrol update ExcNodeList), requeues included.
absl::Status ExcludeNodesFromJob(const std::string& job_id, const std::vector<std::string>& nodes);
// SlurmdTimeout from `scontrol show config`: how long slurmctld waits for a silent node's slurmd
// before it marks the node DOWN (and ends its jobs NODE_FAIL).
absl::StatusOr<absl::Duration> SlurmdTimeout();

}  // namespace dt::ctl
