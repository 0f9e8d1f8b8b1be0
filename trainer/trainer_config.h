// Everything dttrainer can be told, in one struct (filled from flags and the environment by
// main.cc; no torch here).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/file_write_mode.h"

namespace dt {

struct TrainerConfig {
  // Who this process is.
  std::string coordinator;  // HOST:PORT (--coordinator / DT_COORDINATOR)
  std::string run_id;       // --run / DT_RUN_ID
  std::string token;        // DT_RUN_TOKEN, else DT_TOKEN
  std::string tls_ca;
  int local_slot = 0;                 // --local-rank / SLURM_LOCALID / LOCAL_RANK
  std::string node;                   // SLURMD_NODENAME / host name
  std::optional<int> scheduler_task;  // SLURM_PROCID inside an srun step
  int expect_nodes = 0;               // the world this process was started for (0: take the run's)
  int expect_procs_per_node = 0;
  // Bring your own sbatch: create-or-join a run keyed by experiment + Slurm job id.
  std::string experiment_name;
  std::string save_dir;
  int max_restarts = 0;
  std::vector<std::string> argv;  // recorded in the run spec

  // Model.
  std::string model = "gpt2";
  std::string config_overrides;
  double dropout = 0.0;

  // Data.
  std::string dataset;
  std::string tokenizer_dir;
  std::string data_cache_dir;  // token caches; "" = <save_dir>/.dt-cache (shared by experiments)
  double eval_split = 0.05;
  int64_t eval_freq = 0;
  int64_t eval_batches = 8;

  // Loop.
  int batch_size = 8;
  int seq_len = 256;
  int grad_accum = 1;
  // Samples per optimizer step across all ranks (0: batch x grad_accum x world). Set, it fixes the
  // accumulation from the world size, so a run resumed at another size keeps its global batch.
  int64_t global_batch_size = 0;
  int64_t max_steps = 0;
  int64_t num_epochs = 0;
  double lr = 3e-4;
  double min_lr = -1;  // <0: lr / 10
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  int64_t warmup_steps = 0;
  double grad_clip = 1.0;
  // "fp32", or "bf16": autocast's bf16 for the forward passes, fp32 weights and AdamW state.
  std::string precision = "fp32";
  int zero = 0;  // ZeRO stage: 0, or 1 (AdamW's moments partitioned across the ranks)
  int64_t ckpt_freq = 0;
  // Asynchronous checkpoint rounds: training pauses only while the writer copies the state into
  // host memory (twice the model and optimizer's memory for that while); false: it waits for the
  // whole write and commit.
  bool async_checkpoint = true;
  // How checkpoint files reach the disk (client/file_write_mode.h); unset: CheckpointWriteMode's
  // choice for the device.
  std::optional<FileWriteMode> checkpoint_io;
  int64_t log_freq = 10;
  uint64_t seed = 1337;
  int threads = 0;      // 0: OMP_NUM_THREADS, else 1
  std::string backend;  // "" = nccl with CUDA, else gloo
  bool report_metrics = true;
  int64_t exit_after_step = 0;           // fault injection: vanish (no cleanup) after this step and its round
  int64_t exit_while_checkpointing = 0;  // fault injection: the writer vanishes before this round's commit
  // Testing on the CPU: a logged step's line and point are made while the next step runs and a
  // round begins before its step's point, as on a GPU (where it is always so).
  bool late_step_points = false;
  // Fault injection: after step stop_after_steps[i] and its round, the process on stop_nodes[i]
  // (every process when no node is given) stops itself with SIGSTOP, as a node that hangs or drops
  // off the network.
  std::vector<int64_t> stop_after_steps;
  std::vector<std::string> stop_nodes;
  int64_t rendezvous_timeout_s = 900;
  std::string log_dir;  // --log-dir / DT_LOG_DIR: write output to <dir>/rank-<R>.log
  // --profile-trace: rank 0 writes a Chrome trace of profile_steps steps from profile_first_step.
  std::string profile_trace;
  int64_t profile_first_step = 6;
  int64_t profile_steps = 3;
};

}  // namespace dt
