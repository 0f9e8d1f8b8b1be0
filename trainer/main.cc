// dttrainer: one training process per device. See `dttrainer --help`.
#include <malloc.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "common/blas_core.h"
#include "common/cli_checks.h"

#include <nlohmann/json.hpp>
#include "absl/synchronization/mutex.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/agent.h"
#include "client/coordinator_client.h"
#include "client/file_write_mode.h"
#include "common/data_dir.h"
#include "common/env.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "common/version.h"
#include "trainer/autocast.h"
#include "trainer/checkpoint_io.h"
#include "trainer/gpt2_tokenizer.h"
#include "trainer/process_group.h"
#include "trainer/trainer.h"

namespace {

using dt::Env;
using dt::EnvInt;

int Tokenize(const std::string& dir, const std::string& file, const std::string& text) {
  auto tok = dt::Gpt2Tokenizer::Load(dir);
  if (!tok.ok()) {
    std::cerr << "dttrainer tokenize: " << tok.status().message() << "\n";
    return 2;
  }
  std::string input = text;
  if (!file.empty()) {
    auto content = dt::ReadFile(file);
    if (!content.ok()) {
      std::cerr << "dttrainer tokenize: " << content.status().message() << "\n";
      return 2;
    }
    input = *content;
  }
  std::cout << nlohmann::json((*tok)->Encode(input)).dump() << "\n";
  return 0;
}

int Decode(const std::string& dir, const std::string& ids_text) {
  auto tok = dt::Gpt2Tokenizer::Load(dir);
  if (!tok.ok()) {
    std::cerr << "dttrainer decode: " << tok.status().message() << "\n";
    return 2;
  }
  nlohmann::json ids = nlohmann::json::parse(ids_text, nullptr, false);
  std::vector<int32_t> parsed;
  if (ids.is_array()) {
    for (const auto& v : ids) {
      if (!v.is_number_integer()) {
        ids = nlohmann::json();
        break;
      }
      parsed.push_back(v.get<int32_t>());
    }
  }
  if (!ids.is_array()) {
    std::cerr << "dttrainer decode: expected a JSON array of token ids, e.g. [15496, 995]\n";
    return 2;
  }
  auto text = (*tok)->Decode(parsed);
  if (!text.ok()) {
    std::cerr << "dttrainer decode: " << text.status().message() << "\n";
    return 2;
  }
  std::cout << *text;
  return 0;
}

int CheckpointDiff(const std::string& a, const std::string& b) {
  auto diffs = dt::CompareModels(a, b);
  if (!diffs.ok()) {
    std::cerr << "dttrainer ckpt-diff: " << diffs.status().message() << "\n";
    return 2;
  }
  double max = 0;
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, d] : *diffs) {
    tensors[name] = d;
    max = std::max(max, d);
  }
  std::cout << nlohmann::json({{"max_abs_diff", max}, {"tensors", tensors}}).dump(2) << "\n";
  return 0;
}

// Who this process is and which run it joins; defaults from the environment a launcher sets.
void DeclareIdentityFlags(CLI::App& app, dt::TrainerConfig& c, std::string& token_file) {
  c.coordinator = Env("DT_COORDINATOR");
  c.run_id = Env("DT_RUN_ID");
  c.tls_ca = Env("DT_TLS_CA");
  c.local_slot = EnvInt("SLURM_LOCALID", EnvInt("LOCAL_RANK", 0));
  // Under srun: the task id srun names when it reports a failed task.
  if (int task = EnvInt("SLURM_PROCID", -1); task >= 0 && !Env("SLURM_STEP_ID").empty()) c.scheduler_task = task;
  c.node = dt::NodeName();
  auto* id = "Identity";
  app.add_option("--coordinator", c.coordinator, "dtcoord address HOST:PORT (default: $DT_COORDINATOR)")->group(id);
  app.add_option("--run", c.run_id, "run id (default: $DT_RUN_ID)")->group(id);
  app.add_option("--token-file", token_file, "file holding the token (default: $DT_RUN_TOKEN, else $DT_TOKEN)")
      ->group(id);
  app.add_option("--tls-ca", c.tls_ca, "PEM roots to verify a TLS coordinator (default: $DT_TLS_CA)")->group(id);
  app.add_option("--local-rank", c.local_slot,
                 "this process's slot on its node (default: $SLURM_LOCALID, else $LOCAL_RANK, else 0)")
      ->group(id);
  app.add_option("--node", c.node, "node name ranks are grouped by (default: $SLURMD_NODENAME, else the host name)")
      ->group(id);
  app.add_option("--nnodes", c.expect_nodes, "nodes this process expects; refused if the run disagrees")->group(id);
  app.add_option("--nproc-per-node", c.expect_procs_per_node, "processes per node this process expects")->group(id);
  app.add_option("--experiment-name", c.experiment_name,
                 "without --run: create or join the run of this experiment and Slurm job")
      ->group(id);
  app.add_option("--save-dir", c.save_dir, "without --run: where the experiment directory goes")->group(id);
  app.add_option("--max-restarts", c.max_restarts, "without --run: restarts the created run allows")->group(id);
  c.log_dir = Env("DT_LOG_DIR");
  app.add_option("--log-dir", c.log_dir, "after registering, write output to <dir>/rank-<R>.log (default: $DT_LOG_DIR)")
      ->group(id);
  app.add_option("--rendezvous-timeout", c.rendezvous_timeout_s, "seconds to wait for every rank to register")
      ->check(dt::InRange(1, 7 * 24 * 3600))
      ->group(id)
      ->capture_default_str();
}

void DeclareModelAndDataFlags(CLI::App& app, dt::TrainerConfig& c, const std::string& default_tokenizer) {
  auto* model = "Model";
  app.add_option("--model", c.model, "gpt2 (124M), gpt2-medium (350M) or tiny")->group(model)->capture_default_str();
  app.add_option("--config-overrides", c.config_overrides, "e.g. n_embd=128,n_layer=4,n_head=4,n_positions=256")
      ->group(model);
  app.add_option("--dropout", c.dropout, "dropout probability")->group(model)->capture_default_str();

  auto* data = "Data";
  app.add_option("--dataset", c.dataset, "Alpaca .json/.jsonl, .jsonl with \"text\", or .txt")->group(data);
  c.tokenizer_dir = default_tokenizer;
  app.add_option("--tokenizer-dir", c.tokenizer_dir,
                 "encoder.json + vocab.bpe (or vocab.json + merges.txt); default: the GPT-2 files shipped "
                 "in dt's data/ (installed or in the source tree)")
      ->group(data)
      ->capture_default_str();
  app.add_option("--data-cache-dir", c.data_cache_dir,
                 "where tokenized datasets are cached (default: .dt-cache beside the experiment directory, "
                 "shared by experiments)")
      ->group(data);
  app.add_option("--eval-split", c.eval_split, "fraction of samples held out for evaluation")
      ->group(data)
      ->capture_default_str();
  app.add_option("--eval-freq", c.eval_freq, "evaluate every N steps (0: never; also at the end when > 0)")
      ->group(data);
  app.add_option("--eval-batches", c.eval_batches, "batches per rank per evaluation")
      ->group(data)
      ->capture_default_str();
}

// The Training group's checkpoint flags: when rounds happen, whether they overlap the steps, how
// their files reach the disk.
void DeclareCheckpointFlags(CLI::App& app, dt::TrainerConfig& c, const char* loop) {
  app.add_option("--ckpt-freq", c.ckpt_freq, "checkpoint every N steps (0: only at the end)")->group(loop);
  app.add_flag("--async-checkpoint,!--sync-checkpoint", c.async_checkpoint,
               "write checkpoints in the background: the writer copies the model and optimizer into host memory "
               "while the next step's forward and backward passes run (its optimizer step waits for what is left of "
               "the copy), which needs that much memory again (--sync-checkpoint: pause for the whole write and "
               "commit)")
      ->group(loop)
      ->capture_default_str();
  // --checkpoint-io's values: auto (unset), then every mode by its name.
  using WriteModeNames = std::vector<std::pair<std::string, std::optional<dt::FileWriteMode>>>;
  static const WriteModeNames kWriteModes = [] {
    WriteModeNames modes = {{"auto", std::nullopt}};
    for (dt::FileWriteMode mode : dt::kFileWriteModes) modes.emplace_back(dt::FileWriteModeName(mode), mode);
    return modes;
  }();
  app.add_option_function<std::string>(
         "--checkpoint-io",
         [&c](const std::string& name) {
           for (const auto& [known, mode] : kWriteModes) {
             if (known == name) c.checkpoint_io = mode;
           }
         },
         "how checkpoint files reach the disk: write-behind (through the page cache, each 8 MiB range written "
         "back at once and dropped from the cache once on disk: the disk's queue stays deep and a checkpoint "
         "holds about 24 MiB of the node's page cache; the most throughput where the host's cores are free), "
         "direct (O_DIRECT: the least CPU, one write in flight per file; the most throughput where training "
         "keeps the cores busy), buffered (left in the page cache until the fsync), auto (write-behind on a "
         "GPU, direct on the CPU)")
      ->check(CLI::IsMember(kWriteModes))
      ->type_name("MODE")
      ->group(loop)
      ->default_str("auto");
  // The flags before --checkpoint-io, kept for the scripts that use them.
  app.add_flag_callback("--checkpoint-direct-io", [&c] { c.checkpoint_io = dt::FileWriteMode::kDirect; })->group("");
  app.add_flag_callback("--checkpoint-buffered-io", [&c] { c.checkpoint_io = dt::FileWriteMode::kBuffered; })
      ->group("");
}

// The flags the tests use to make a rank fail, hang or report late at a chosen step.
void DeclareTestingFlags(CLI::App& app, dt::TrainerConfig& c, const char* loop) {
  app.add_option("--exit-after-step", c.exit_after_step,
                 "testing: vanish without cleanup after this step (and its checkpoint round), as a killed process "
                 "would")
      ->group(loop);
  app.add_option("--stop-after-step", c.stop_after_steps,
                 "testing: stop this process (SIGSTOP) after this step and its checkpoint round, as a node that hangs "
                 "or drops off the network would; with --stop-node, only the process on that node. Comma-separated "
                 "steps stop --stop-node's comma-separated nodes in turn")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(loop);
  app.add_option("--stop-node", c.stop_nodes,
                 "testing: the node whose process --stop-after-step stops (comma-separated: one per step)")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(loop);
  app.add_flag("--late-step-points", c.late_step_points,
               "testing: make each step's log line and metrics point while the next step runs, as a GPU rank always "
               "does (it reads the step's loss from the device a step late)")
      ->group(loop);
  app.add_option("--exit-while-checkpointing", c.exit_while_checkpointing,
                 "testing: the writer of the round at this step vanishes after writing its files, before the commit")
      ->group(loop);
}

void DeclareTrainingFlags(CLI::App& app, dt::TrainerConfig& c, bool& no_metrics) {
  auto* loop = "Training";
  app.add_option("--batch-size", c.batch_size, "sequences per rank per micro-step")->group(loop)->capture_default_str();
  app.add_option("--seq-len", c.seq_len, "tokens per sequence")->group(loop)->capture_default_str();
  app.add_option("--grad-accum", c.grad_accum, "micro-steps per optimizer step (gradients sync on the last)")
      ->group(loop)
      ->capture_default_str();
  app.add_option("--global-batch-size", c.global_batch_size,
                 "sequences per optimizer step across all ranks (= batch x accumulation x world): the accumulation "
                 "is computed from the world size, so a run resumed at another size keeps its global batch and "
                 "data order; replaces --grad-accum")
      ->group(loop);
  app.add_option("--precision", c.precision,
                 "fp32, or bf16: the matrix products and attention in bfloat16 (autocast), the weights, gradients and "
                 "AdamW state in fp32; no loss scaling is needed")
      ->group(loop)
      ->capture_default_str();
  app.add_option("--zero", c.zero,
                 "ZeRO stage: 0 keeps the whole AdamW state on every rank; 1 partitions it (each rank keeps and steps "
                 "1/world of the moments, then the ranks share the updated parameters), and every rank writes its "
                 "share of each checkpoint")
      ->group(loop)
      ->capture_default_str();
  app.add_option("--max-steps", c.max_steps, "optimizer steps to train (or --num-epochs)")->group(loop);
  app.add_option("--num-epochs", c.num_epochs, "epochs to train when --max-steps is 0")->group(loop);
  app.add_option("--lr", c.lr, "peak learning rate (AdamW)")->group(loop)->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "final learning rate of the cosine decay (default: lr/10)")->group(loop);
  app.add_option("--warmup-steps", c.warmup_steps, "linear warmup steps")->group(loop)->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay (not on biases and LayerNorm)")
      ->group(loop)
      ->capture_default_str();
  app.add_option("--beta1", c.beta1, "AdamW beta1")->group(loop)->capture_default_str();
  app.add_option("--beta2", c.beta2, "AdamW beta2")->group(loop)->capture_default_str();
  app.add_option("--grad-clip", c.grad_clip, "clip the gradient norm to this")->group(loop)->capture_default_str();
  app.add_option("--log-freq", c.log_freq, "report metrics every N steps")->group(loop)->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the model init and the data order")->group(loop)->capture_default_str();
  app.add_option("--threads", c.threads, "intra-op threads (default: $OMP_NUM_THREADS, else 1)")->group(loop);
  app.add_option("--backend", c.backend, "gloo or nccl (default: nccl when CUDA is available, else gloo)")->group(loop);
  app.add_flag("--no-metrics", no_metrics, "do not report metrics to the coordinator")->group(loop);
  DeclareCheckpointFlags(app, c, loop);
  DeclareTestingFlags(app, c, loop);
  app.add_option("--profile-trace", c.profile_trace,
                 "rank 0 writes a Chrome trace (torch.profiler's format: operators, and CUDA kernels on a GPU) of "
                 "--profile-steps steps from --profile-first-step to this file")
      ->group(loop);
  app.add_option("--profile-first-step", c.profile_first_step, "the first step --profile-trace traces")
      ->group(loop)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--profile-steps", c.profile_steps, "how many steps --profile-trace traces")
      ->group(loop)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

// The debugging tools: tokenize, decode, ckpt-diff.
struct Tools {
  std::string tok_dir, tok_file, tok_text, ids_text, diff_a, diff_b;
  CLI::App *tokenize, *decode, *diff;
};

void DeclareTools(CLI::App& app, Tools& t, const std::string& default_tokenizer) {
  t.tok_dir = default_tokenizer;
  t.tokenize = app.add_subcommand("tokenize", "print the GPT-2 token ids of a text or file as JSON");
  t.tokenize->add_option("--tokenizer-dir", t.tok_dir, "encoder.json + vocab.bpe directory")->capture_default_str();
  t.tokenize->add_option("--file", t.tok_file, "file to tokenize");
  t.tokenize->add_option("text", t.tok_text, "text to tokenize");
  t.decode = app.add_subcommand("decode", "print the text of a JSON array of token ids");
  t.decode->add_option("--tokenizer-dir", t.tok_dir, "encoder.json + vocab.bpe directory")->capture_default_str();
  t.decode->add_option("ids", t.ids_text, "e.g. [15496, 995]")->required();
  t.diff = app.add_subcommand("ckpt-diff", "largest absolute parameter difference of two checkpoints");
  t.diff->add_option("a", t.diff_a, "checkpoint directory")->required();
  t.diff->add_option("b", t.diff_b, "checkpoint directory")->required();
}

constexpr char kNoTokenizer[] =
    "--tokenizer-dir is required: no GPT-2 tokenizer files were found in dt's data/ folder (looked beside "
    "this binary and in its source tree); pass the directory holding encoder.json and vocab.bpe";

// The tool's exit code, or nullopt when no tool was asked for.
std::optional<int> RunTool(const Tools& t) {
  if ((t.tokenize->parsed() || t.decode->parsed()) && t.tok_dir.empty()) {
    std::cerr << "dttrainer: " << kNoTokenizer << "\n";
    return 2;
  }
  if (t.tokenize->parsed()) return Tokenize(t.tok_dir, t.tok_file, t.tok_text);
  if (t.decode->parsed()) return Decode(t.tok_dir, t.ids_text);
  if (t.diff->parsed()) return CheckpointDiff(t.diff_a, t.diff_b);
  return std::nullopt;
}

// What is wrong with the configuration, in words a person can act on; "" when nothing.
std::string ConfigProblem(const dt::TrainerConfig& c) {
  if (c.coordinator.empty()) return "no coordinator: pass --coordinator HOST:PORT or set DT_COORDINATOR";
  if (c.run_id.empty() &&
      (c.experiment_name.empty() || c.save_dir.empty() || c.expect_nodes <= 0 || c.expect_procs_per_node <= 0)) {
    return "no run: pass --run (or DT_RUN_ID), or --experiment-name, --save-dir, --nnodes and --nproc-per-node to "
           "create or join one";
  }
  if (c.dataset.empty()) return "--dataset is required";
  if (c.tokenizer_dir.empty()) return kNoTokenizer;
  if (c.max_steps <= 0 && c.num_epochs <= 0) return "give --max-steps or --num-epochs";
  if (c.batch_size <= 0) return absl::StrCat("--batch-size must be ≥ 1, got ", c.batch_size);
  if (c.grad_accum <= 0) return absl::StrCat("--grad-accum must be ≥ 1, got ", c.grad_accum);
  if (c.global_batch_size < 0) return absl::StrCat("--global-batch-size must be ≥ 1, got ", c.global_batch_size);
  if (c.global_batch_size > 0 && c.grad_accum != 1) {
    return "give --global-batch-size or --grad-accum, not both: the accumulation follows from the global batch";
  }
  if (!c.stop_nodes.empty() && c.stop_nodes.size() != c.stop_after_steps.size()) {
    return absl::StrCat("--stop-node names ", c.stop_nodes.size(), " node(s) for ", c.stop_after_steps.size(),
                        " --stop-after-step step(s): give one node per step");
  }
  if (absl::StatusOr<dt::Precision> p = dt::ParsePrecision(c.precision); !p.ok()) {
    return std::string(p.status().message());
  }
  if (c.zero != 0 && c.zero != 1) {
    return absl::StrCat(
        "--zero ", c.zero,
        " is not offered: dttrainer has stage 0 (every rank keeps the whole optimizer state) and stage 1 "
        "(--zero 1, the optimizer state partitioned across the ranks); gradients and parameters are not "
        "partitioned");
  }
  if (c.seq_len <= 1) return absl::StrCat("--seq-len must be ≥ 2, got ", c.seq_len);
  if (c.eval_split < 0 || c.eval_split >= 1) return absl::StrCat("--eval-split must be in [0, 1), got ", c.eval_split);
  if (c.eval_batches <= 0) return absl::StrCat("--eval-batches must be ≥ 1, got ", c.eval_batches);
  if (!(c.lr > 0)) return absl::StrCat("--lr must be positive, got ", c.lr);
  if (!(c.dropout >= 0 && c.dropout < 1)) return absl::StrCat("--dropout must be in [0, 1), got ", c.dropout);
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return absl::StrCat("--beta1 must be in [0, 1), got ", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return absl::StrCat("--beta2 must be in [0, 1), got ", c.beta2);
  if (!(c.weight_decay >= 0)) return absl::StrCat("--weight-decay must not be negative, got ", c.weight_decay);
  if (!(c.grad_clip > 0)) return absl::StrCat("--grad-clip must be positive, got ", c.grad_clip);
  if (c.warmup_steps < 0) return absl::StrCat("--warmup-steps must not be negative, got ", c.warmup_steps);
  if (c.local_slot < 0) return "--local-rank must not be negative";
  return "";
}

}  // namespace

// Tensors of tens of MB and more (the logits: batch x sequence x 50,257 floats) are allocated and
// freed every step. glibc serves each with mmap and gives it back with munmap (its mmap threshold
// tops out at 32 MB), so every step faulted and zeroed those pages afresh: a third of a CPU step's
// samples were in the kernel's page-fault path (perf, GPT-2 4x128, 512 tokens, one thread).
// Served from the heap and reused instead: 0.85 -> 0.73 s a step. The heap then keeps its peak
// (which every step reaches anyway). A user's GLIBC_TUNABLES decides instead, when set.
static void KeepLargeAllocationsInTheHeap() {
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return;
  ::mallopt(M_MMAP_MAX, 0);
  ::mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

int main(int argc, char** argv) {
  // Before any thread exists: SIGTERM/SIGINT go to one watcher thread (see RunTrainer).
  dt::BlockStopSignals();
  // Gloo writes to its peers with writev, which raises SIGPIPE when the peer has just died. Gloo
  // expects the EPIPE that follows (Python ignores the signal), and turns the dead peer into an
  // error this rank reports, or survives until srun's SIGTERM makes it a victim; by default the
  // signal would kill it silently, leaving the run without its root cause.
  std::signal(SIGPIPE, SIG_IGN);
  // A hang's evidence: this process's own stack capture tool (eu-stack, its child) may attach to it
  // under Yama's ptrace_scope 1, where only ancestors may by default. (Without Yama: EINVAL.)
  ::prctl(PR_SET_PTRACER, ::getpid(), 0, 0, 0);
  // absl's lock-order checking costs a graph update per lock; the tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  dt::SetLogProgram("dttrainer");
  CLI::App app{
      "dttrainer: one GPT-2 training process per device, coordinated by dtcoord.\n"
      "Usually started by `dtctl submit` (local or Slurm) with DT_COORDINATOR, DT_RUN_ID and\n"
      "DT_RUN_TOKEN set. With your own sbatch script, give --experiment-name/--save-dir/--nnodes/\n"
      "--nproc-per-node and DT_TOKEN: the tasks of one Slurm job create or join one run."};
  // The version names the backends (and CUDA devices) this build can run: tests and users ask it
  // whether NCCL is there before they submit a GPU run.
  app.set_version_flag("--version", [] { return absl::StrCat(dt::kVersion, " (", dt::DescribeBackends(), ")"); });
  app.require_subcommand(0, 1);
  // A later occurrence of a flag overrides an earlier one (launchers append to user arguments).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  dt::TrainerConfig c;
  std::string token_file;
  bool no_metrics = false;
  const std::string default_tokenizer = dt::FindDefaultTokenizerDir().value_or("");
  DeclareIdentityFlags(app, c, token_file);
  DeclareModelAndDataFlags(app, c, default_tokenizer);
  DeclareTrainingFlags(app, c, no_metrics);
  Tools tools;
  DeclareTools(app, tools, default_tokenizer);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dt::ExitOnParseError(app, e, "dttrainer");
  }
  dt::WatchStopSignals();       // with no handler installed a stop signal ends the process as usual
  dt::WatchPreemptionSignal();  // SIGUSR2: checkpoint at a step every rank agrees on, then stop
  if (std::optional<int> code = RunTool(tools)) return *code;
  // Before any training: OpenBLAS chose its kernels when LibTorch loaded it, and on a CPU it does
  // not know, that choice is its slowest (common/blas_core.h). A trainer started without dt's
  // launchers (srun's tasks, a user's own launcher) then starts again with a better one; pending
  // stop signals stay pending across the exec.
  dt::RestartWithBetterOpenBlasCore(argv);
  KeepLargeAllocationsInTheHeap();
  std::string problem = ConfigProblem(c);
  absl::StatusOr<std::string> token = dt::ResolveRunToken(token_file);
  if (problem.empty() && !token.ok()) {
    problem = token_file.empty() ? "no token: set DT_RUN_TOKEN (from dtctl submit) or DT_TOKEN, or pass --token-file"
                                 : std::string(token.status().message());
  }
  if (!problem.empty()) {
    std::cerr << "dttrainer: " << problem << " (see dttrainer --help)\n";
    return 2;
  }
  c.token = *token;
  c.report_metrics = !no_metrics;
  for (int i = 0; i < argc; ++i) c.argv.emplace_back(argv[i]);
  return dt::RunTrainer(c);
}
