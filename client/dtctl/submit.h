// `dtctl submit`: a run spec from flags and/or a YAML run file, pre-flight checks that fail in a
// second instead of after hours in a queue, then the coordinator's SubmitRun and the launch
// (the local launcher, or sbatch).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace dt::ctl {

struct SubmitOptions {
  std::string name;
  std::string save_dir;
  int nodes = 1;
  // --nodes MIN:MAX: an elastic run goes on with the nodes that remain (at least this many) when a
  // node is lost; 0: `nodes` always (RunSpec.min_nodes).
  int min_nodes = 0;
  int nproc_per_node = 1;  // the count (with nproc_rule: the count found here, or 0 on Slurm)
  // --nproc-per-node gpu|cpu|auto (empty: nproc_per_node is what was asked). CountProcsPerNode
  // counts a local run's here; each Slurm node's dtrun counts its own.
  std::string nproc_rule;
  std::string scheduler = "local";  // local | slurm
  std::string log_strategy = "main";
  std::string wandb_project;
  std::string wandb_entity;
  std::string wandb_mode;
  std::vector<std::string> wandb_tags;
  int max_restarts = 0;
  int keep_checkpoints = 3;
  int max_requeues = 3;       // Slurm: requeues after a preemption or the time limit
  int preempt_grace_s = 120;  // Slurm: #SBATCH --signal=USR2@<this>
  int gpus_per_node = 0;
  int omp_threads = 0;
  std::vector<std::string> sbatch_args;
  std::string trainer;  // default: dttrainer beside dtctl
  std::vector<std::string> trainer_args;
  // `--exec -- CMD ARGS...`: the user's program, started once per rank by dtrun (no dttrainer).
  std::vector<std::string> exec_command;
  // --exec runs: a rank idle this long (no output, no CPU, no step) is hung: "20m", "90s", or "0"
  // to turn the check off. Empty: the coordinator's default.
  std::string idle_timeout;
  int max_identical_hangs = 0;  // 0: the coordinator's default (1)
  // Variables every rank gets (--env KEY=VALUE, --env-file, a run file's env:).
  std::map<std::string, std::string> env;
};

// The idle timeout `text` names ("0" or "off": none, returned as zero). INVALID_ARGUMENT naming
// the flag otherwise.
absl::StatusOr<absl::Duration> ParseIdleTimeout(const std::string& text);

// Fills `options` from a YAML run file. Fields: name, save_dir, nodes, nproc_per_node (a count, or
// gpu, cpu, auto), scheduler, log_strategy, wandb: {project, entity, mode, tags}, max_restarts, keep_checkpoints,
// gpus_per_node, omp_threads, sbatch_args: [...], trainer, trainer_args: [...], exec: [CMD, ARGS...],
// max_requeues, preempt_grace (seconds), idle_timeout ("20m"), max_identical_hangs, env: {KEY: value}.
// INVALID_ARGUMENT names the file and the field.
// --nodes (and a run file's nodes:): a count, or MIN:MAX with 1 ≤ MIN < MAX (an elastic run).
struct NodeRange {
  int min = 0;  // 0: a fixed count
  int max = 1;
};
absl::StatusOr<NodeRange> ParseNodeRange(const std::string& text);

// An elastic dttrainer run's --global-batch-size must divide into --batch-size x world at every
// world size it may run at (MIN..MAX nodes): the first node count at which it does not, with the
// arithmetic. OK for a fixed run, an --exec run or a run without --global-batch-size.
absl::Status CheckElasticGlobalBatch(const SubmitOptions& options);

absl::Status LoadRunFile(const std::string& path, SubmitOptions* options);
// The same from the file's text (`path` names it in messages).
absl::Status ParseRunFile(const std::string& path, const std::string& text, SubmitOptions* options);

// Makes --dataset and --tokenizer-dir among the trainer arguments, and the trainer path, absolute;
// adds --tokenizer-dir naming the GPT-2 files shipped in dt's data/ when none is given. An --exec
// program given by a relative path ("./train.sh") is made absolute; its arguments are its own.
void AbsolutizeTrainerPaths(SubmitOptions* options);

// --nproc-per-node gpu|cpu|auto: a local run's ranks all run on this machine, so it is counted
// here (FAILED_PRECONDITION for gpu without a visible GPU); a Slurm run leaves it to each node's
// dtrun (0 here), which only --exec runs have (INVALID_ARGUMENT for a dttrainer run on Slurm).
absl::Status CountProcsPerNode(SubmitOptions* options);

// Each problem is FAILED_PRECONDITION / INVALID_ARGUMENT with what to do about it.
absl::Status Preflight(const SubmitOptions& options);

struct Submitted {
  std::string run_id;
  std::string exp_dir;
  std::string job_id;  // Slurm job id, or the local launcher's pid
  int64_t resume_step = 0;
};

// What SubmitAndLaunch would start, without a coordinator: the rendered sbatch script (token
// redacted) or the local trainer command lines.
absl::StatusOr<std::string> DescribeLaunch(const SubmitOptions& options, const std::string& coordinator);

absl::StatusOr<Submitted> SubmitAndLaunch(const std::shared_ptr<CoordinatorClient>& client,
                                          const SubmitOptions& options, const std::string& tls_ca);

}  // namespace dt::ctl
