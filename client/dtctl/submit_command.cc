#include "client/dtctl/submit_command.h"

#include <unistd.h>

#include <functional>
#include <iostream>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/dtctl/submit.h"
#include "client/dtctl/watch.h"
#include "common/cli_checks.h"
#include "common/fs.h"
#include "common/limits.h"
#include "common/procs_per_node.h"
#include "common/run_env.h"
#include "common/subprocess.h"

namespace dt::ctl {

// `dtctl submit`'s flags, each declared once: what it sets, and — when given on the command line —
// that it overrides the run file.
class SubmitFlags {
 public:
  explicit SubmitFlags(CLI::App* submit) : submit_(submit) {}

  template <typename T>
  CLI::Option* Add(const std::string& name, T SubmitOptions::*field, const std::string& help) {
    CLI::Option* option = submit_->add_option(name, flags_.*field, help);
    overrides_.emplace_back(option, [this, field](SubmitOptions& merged) { merged.*field = flags_.*field; });
    return option;
  }
  // --nproc-per-node: a count, or gpu|cpu|auto counted where the ranks run (SubmitOptions::nproc_rule).
  void AddProcsPerNode() {
    CLI::Option* option =
        submit_
            ->add_option("--nproc-per-node", procs_text_,
                         "processes per node: a count (one per GPU), or as torchrun: gpu (one per visible GPU), cpu "
                         "(one per usable CPU), auto (gpu where the node has GPUs, else cpu), counted on each node")
            ->check(dt::ProcsPerNodeValue());
    overrides_.emplace_back(option, [this](SubmitOptions& merged) {
      dt::ProcsPerNode parsed = *dt::ParseProcsPerNode(procs_text_);  // the validator accepted it
      merged.nproc_per_node = parsed.count;
      merged.nproc_rule = parsed.rule;
    });
  }
  // --nodes: a count, or MIN:MAX for an elastic run (SubmitOptions::min_nodes).
  void AddNodes() {
    CLI::Option* option =
        submit_
            ->add_option("--nodes", nodes_text_,
                         "nodes: a count, or MIN:MAX for an elastic local run, which starts on MAX and, when a node is "
                         "lost, goes on at once with the nodes that remain (no fewer than MIN) from the latest "
                         "checkpoint; a later restart brings it back to MAX")
            ->check(CLI::Validator(
                [](std::string& text) {
                  absl::StatusOr<NodeRange> parsed = ParseNodeRange(text);
                  return parsed.ok() ? std::string() : std::string(parsed.status().message());
                },
                "COUNT|MIN:MAX"));
    overrides_.emplace_back(option, [this](SubmitOptions& merged) {
      NodeRange parsed = *ParseNodeRange(nodes_text_);  // the validator accepted it
      merged.nodes = parsed.max;
      merged.min_nodes = parsed.min;
    });
  }
  // The run file's options (or the defaults) with every flag the command line gave on top.
  void ApplyGiven(SubmitOptions& merged) const {
    for (const auto& [option, apply] : overrides_) {
      if (option->count() > 0) apply(merged);
    }
  }
  const SubmitOptions& flags() const { return flags_; }

 private:
  CLI::App* submit_;
  SubmitOptions flags_;
  std::string procs_text_;
  std::string nodes_text_;
  std::vector<std::pair<CLI::Option*, std::function<void(SubmitOptions&)>>> overrides_;
};

SubmitCli::SubmitCli() = default;
SubmitCli::~SubmitCli() = default;

void DeclareSubmit(CLI::App& app, SubmitCli& cli) {
  cli.command = app.add_subcommand(
      "submit", "submit a run: dtctl submit --name N --save-dir D [...] -- TRAINER_ARGS, or [...] --exec -- CMD ARGS");
  cli.flags = std::make_unique<SubmitFlags>(cli.command);
  SubmitFlags& f = *cli.flags;
  f.Add("--name", &SubmitOptions::name, "experiment name (the directory under --save-dir)");
  f.Add("--save-dir", &SubmitOptions::save_dir, "where experiment directories go");
  f.AddNodes();
  f.AddProcsPerNode();
  f.Add("--scheduler", &SubmitOptions::scheduler, "local or slurm")->check(CLI::IsMember({"local", "slurm"}));
  f.Add("--log-strategy", &SubmitOptions::log_strategy, "W&B: main, node or all")
      ->check(CLI::IsMember({"main", "node", "all"}));
  f.Add("--wandb-project", &SubmitOptions::wandb_project, "W&B project (the coordinator holds the API key)");
  f.Add("--wandb-entity", &SubmitOptions::wandb_entity, "W&B entity");
  f.Add("--wandb-mode", &SubmitOptions::wandb_mode, "online, offline or disabled")
      ->check(CLI::IsMember({"online", "offline", "disabled"}));
  f.Add("--max-restarts", &SubmitOptions::max_restarts, "restarts of the whole group the run may use")
      ->check(dt::InRange(0, dt::kMaxPolicyCount));
  f.Add("--keep-checkpoints", &SubmitOptions::keep_checkpoints, "committed checkpoints to keep")
      ->check(dt::InRange(1, dt::kMaxPolicyCount));
  f.Add("--max-requeues", &SubmitOptions::max_requeues,
        "Slurm: requeues after a preemption or the time limit the run may use (apart from --max-restarts)")
      ->check(dt::InRange(0, dt::kMaxPolicyCount));
  f.Add("--preempt-grace", &SubmitOptions::preempt_grace_s,
        "Slurm: seconds before a preemption or the time limit at which Slurm sends SIGUSR2 "
        "(#SBATCH --signal=USR2@N): the trainers checkpoint at a step they agree on and the job is "
        "requeued. Must cover a checkpoint round of your model (default 120 s: GPT-2 124M with AdamW "
        "is ~1.5 GB; raise it for larger models or slow file systems)")
      ->check(dt::InRange(10, 86400));
  f.Add("--gpus-per-node", &SubmitOptions::gpus_per_node, "Slurm: request --gres=gpu:N")->check(dt::InRange(0, 1024));
  f.Add("--omp-threads", &SubmitOptions::omp_threads, "OMP_NUM_THREADS per trainer (local default: cores / trainers)")
      ->check(dt::InRange(1, 1024));
  f.Add("--sbatch-arg", &SubmitOptions::sbatch_args,
        "extra #SBATCH option, e.g. --sbatch-arg=--partition=gpu (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  f.Add("--trainer", &SubmitOptions::trainer, "dttrainer binary (default: the one beside dtctl)");
  f.Add("--idle-timeout", &SubmitOptions::idle_timeout,
        "--exec runs: a rank whose processes neither print, nor use CPU, nor report a step for this long is hung: "
        "its stacks are captured and the group restarts (default 20m: shorter than torch's 30-minute collective "
        "timeout; 0 turns it off)");
  f.Add("--max-identical-hangs", &SubmitOptions::max_identical_hangs,
        "a hang whose odd stack repeats this many generations in a row ends the run (HUNG_REPEATEDLY; default 1)")
      ->check(dt::InRange(1, dt::kMaxPolicyCount));
  cli.command->add_option("-f,--file", cli.run_file, "YAML run file; flags override it");
  cli.command
      ->add_option("--env", cli.env,
                   "KEY=VALUE for every rank (repeatable; over --env-file and the run file's env:); dt's own "
                   "names (RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, DT_*, ...) are refused")
      ->expected(1)  // one KEY=VALUE each time: the words after -- are never taken
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli.command->add_option("--env-file", cli.env_file,
                          "a file of KEY=VALUE lines for every rank ('#' comments; values taken as written)");
  cli.command->add_flag("--follow", cli.follow, "watch the run until it ends (exit code as watch)");
  cli.command->add_flag("--dry-run", cli.dry_run,
                        "check and print what would be launched (sbatch script or trainer commands); submit nothing");
  cli.command->add_flag("--exec", cli.exec,
                        "run your own program instead of dttrainer: the words after -- are the command, started once "
                        "per rank by dtrun with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), in this "
                        "directory");
  cli.command->add_option("trainer_args", cli.words, "arguments for dttrainer (or, with --exec, the command), after --")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

namespace {

// A `dtctl submit` flag that dttrainer does not take, among the words after -- (a --dry-run there
// would launch the run instead of printing it).
std::optional<std::string> DtctlFlagAmong(const std::vector<std::string>& words) {
  static const char* const kSubmitOnly[] = {"--dry-run",
                                            "--exec",
                                            "--follow",
                                            "--gpus-per-node",
                                            "--keep-checkpoints",
                                            "--log-strategy",
                                            "--max-requeues",
                                            "--name",
                                            "--nodes",
                                            "--omp-threads",
                                            "--preempt-grace",
                                            "--sbatch-arg",
                                            "--scheduler",
                                            "--trainer",
                                            "--wandb-entity",
                                            "--wandb-mode",
                                            "--wandb-project",
                                            "-f",
                                            "--file",
                                            "--idle-timeout",
                                            "--max-identical-hangs",
                                            "--env",
                                            "--env-file"};
  for (const std::string& w : words) {
    std::string flag = w.substr(0, w.find('='));
    for (const char* f : kSubmitOnly) {
      if (flag == f) return flag;
    }
  }
  return std::nullopt;
}

// The run file, then the flags given, then the words after --; paths made absolute.
absl::StatusOr<SubmitOptions> SubmitOptionsOf(const SubmitCli& cli) {
  SubmitOptions merged;
  if (!cli.run_file.empty()) {
    if (absl::Status s = LoadRunFile(cli.run_file, &merged); !s.ok()) return s;
  }
  cli.flags->ApplyGiven(merged);
  if (!cli.env_file.empty()) {
    absl::StatusOr<std::string> text = dt::ReadFile(cli.env_file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--env-file ", cli.env_file, " cannot be read: ", text.status().message()));
    }
    if (absl::Status s = dt::ParseEnvFile(cli.env_file, *text, &merged.env); !s.ok()) return s;
  }
  for (const std::string& assignment : cli.env) {
    if (absl::Status s = dt::ParseEnvAssignment(assignment, &merged.env); !s.ok()) return s;
  }
  if (cli.exec) {
    if (cli.words.empty()) {
      return absl::InvalidArgumentError("--exec needs the command after --, e.g. --exec -- python3 train.py --lr 3e-4");
    }
    merged.exec_command = cli.words;
    merged.trainer_args.clear();
  } else if (!cli.words.empty()) {
    merged.trainer_args = cli.words;
  }
  if (absl::Status s = CountProcsPerNode(&merged); !s.ok()) return s;
  if (merged.trainer.empty()) merged.trainer = dt::JoinPath(dt::ExecutableDir(), "dttrainer");
  AbsolutizeTrainerPaths(&merged);
  if (!merged.idle_timeout.empty()) {
    if (!cli.exec) {
      return absl::InvalidArgumentError(
          "--idle-timeout applies to --exec programs: dttrainer reports its steps, and a run whose steps stop is "
          "caught by the coordinator's hang timeout");
    }
    if (absl::StatusOr<absl::Duration> idle = ParseIdleTimeout(merged.idle_timeout); !idle.ok()) return idle.status();
  }
  if (merged.name.empty()) return absl::InvalidArgumentError("--name is required (the experiment's name)");
  if (merged.save_dir.empty()) {
    return absl::InvalidArgumentError("--save-dir is required (where experiment directories go)");
  }
  if (!cli.exec) {
    if (std::optional<std::string> misplaced = DtctlFlagAmong(merged.trainer_args)) {
      return absl::InvalidArgumentError(absl::StrCat(
          *misplaced,
          " comes after --, so it would go to dttrainer, which does not take it: put dtctl's flags before --"));
    }
  }
  return merged;
}

}  // namespace

int Submit(Global& g, const SubmitCli& cli) {
  absl::StatusOr<SubmitOptions> options = SubmitOptionsOf(cli);
  if (!options.ok()) {
    std::cerr << "dtctl submit: " << options.status().message() << "\n";
    return kUsage;
  }
  if (!cli.dry_run) {
    if (int c = Connect(g); c != kOk) return c;
  }
  if (absl::Status s = Preflight(*options); !s.ok()) {
    std::cerr << "dtctl submit: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? kUsage : kFailed;
  }
  if (cli.dry_run) {
    absl::StatusOr<std::string> plan = DescribeLaunch(*options, g.coordinator);
    if (!plan.ok()) {
      std::cerr << "dtctl submit: " << plan.status().message() << "\n";
      return kFailed;
    }
    std::cout << *plan;
    return kOk;
  }
  absl::StatusOr<Submitted> run = SubmitAndLaunch(g.client, *options, g.tls_ca);
  if (!run.ok()) return Fail(g, run.status(), "submit");
  if (g.output == "json") {
    PrintJson({{"run_id", run->run_id},
               {"exp_dir", run->exp_dir},
               {"job_id", run->job_id},
               {"resume_step", run->resume_step}});
  } else {
    std::cout << run->run_id << "\n";
    std::cerr << "submitted " << run->run_id << " (" << options->scheduler << " " << run->job_id << "), exp dir "
              << run->exp_dir << (run->resume_step > 0 ? absl::StrCat(", resuming from step ", run->resume_step) : "")
              << "\n  dtctl watch " << run->run_id << "\n";
  }
  if (cli.follow) return Watch(g.client, run->run_id, ::isatty(STDOUT_FILENO) && g.output != "json", std::cout);
  return kOk;
}

}  // namespace dt::ctl
