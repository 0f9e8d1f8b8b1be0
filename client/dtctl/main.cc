// dtctl: the dt command line. Exit codes: 0 ok, 1 the operation failed (the message says why),
// 2 usage error, 3 the coordinator cannot be reached.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/dtctl/batch_commands.h"
#include "client/dtctl/command.h"
#include "client/dtctl/local_launcher.h"
#include "client/dtctl/logs.h"
#include "client/dtctl/run_commands.h"
#include "client/dtctl/submit_command.h"
#include "client/dtctl/watch.h"
#include "common/cli_checks.h"
#include "common/limits.h"
#include "common/version.h"

namespace dt::ctl {
namespace {

// The subcommands that read or change one run, and their arguments.
struct RunCommands {
  std::string run_id;
  std::optional<int> rank;
  LogsQuery logs_query;
  bool verify = false;
  std::string key;
  CLI::App *list, *status, *watch, *logs, *metrics, *checkpoints, *cancel, *stacks;
  std::optional<int64_t> generation;
  bool stored = false;
};

void DeclareRunCommands(CLI::App& app, RunCommands& c) {
  c.list = app.add_subcommand("list", "list runs, newest first");
  c.status = app.add_subcommand("status", "one run: state, ranks, root cause, Slurm job");
  c.watch = app.add_subcommand("watch", "live progress until the run ends; exit 0 only if it SUCCEEDED");
  c.logs = app.add_subcommand("logs", "trainer output (<exp_dir>/logs/rank-<R>.log)");
  c.logs->add_option("--rank", c.rank, "only this rank")->check(dt::InRange(0, dt::kMaxWorldSize - 1));
  c.logs->add_flag("-f,--follow", c.logs_query.follow, "keep printing until the run ends");
  c.logs->add_flag("--all", c.logs_query.all,
                   "every rank's lines in one stream, in time order, each prefixed [rank R]");
  c.logs->add_flag("--fold", c.logs_query.fold,
                   "with --all: a line every rank printed alike is shown once, naming the ranks");
  c.logs->add_option("--grep", c.logs_query.grep, "only lines this regular expression (RE2) finds");
  c.metrics = app.add_subcommand("metrics", "metric history (-o json|csv|table)");
  c.metrics->add_option("--key", c.key, "only this metric (e.g. loss)");
  c.metrics->add_option("--rank", c.rank, "only this rank")->check(dt::InRange(0, dt::kMaxWorldSize - 1));
  c.checkpoints = app.add_subcommand("checkpoints", "committed checkpoints of a run");
  c.checkpoints->add_flag("--verify", c.verify,
                          "read every file again and check its size and SHA-256 against what the writer recorded "
                          "(from a machine that sees the save dir; exit 1 if one differs)");
  c.cancel = app.add_subcommand("cancel", "cancel a run (and its Slurm job); harmless when repeated");
  c.stacks = app.add_subcommand(
      "stacks",
      "stacks of every rank's processes: captured now while the run trains (it goes on), else the captures kept "
      "(every hang's), with the verdict: identical stacks grouped, the odd one out named");
  c.stacks->add_option("--rank", c.rank, "only this rank's stacks")->check(dt::InRange(0, dt::kMaxWorldSize - 1));
  c.stacks->add_option("--generation", c.generation, "the capture kept for this generation")
      ->check(dt::InRange(0, 1 << 30));
  c.stacks->add_flag("--stored", c.stored, "the captures kept, even while the run trains");
  for (CLI::App* sub : {c.status, c.watch, c.logs, c.metrics, c.checkpoints, c.cancel, c.stacks}) {
    sub->add_option("RUN_ID", c.run_id, "run id (dtctl list shows them)")->required();
  }
}

int RunSubcommand(Global& g, const RunCommands& c) {
  if (int code = Connect(g); code != kOk) return code;
  if (c.list->parsed()) return List(g);
  if (c.status->parsed()) return Status(g, c.run_id);
  if (c.watch->parsed()) return Watch(g.client, c.run_id, ::isatty(STDOUT_FILENO) != 0, std::cout);
  if (c.logs->parsed()) {
    if (c.logs_query.fold && !c.logs_query.all) {
      std::cerr << "dtctl logs: --fold folds the one stream of --all: add --all\n";
      return kUsage;
    }
    return Logs(g, c.run_id, c.rank, c.logs_query);
  }
  if (c.metrics->parsed()) return Metrics(g, c.run_id, c.key, c.rank);
  if (c.checkpoints->parsed()) return Checkpoints(g, c.run_id, c.verify);
  if (c.cancel->parsed()) return Cancel(g, c.run_id);
  if (c.stacks->parsed()) return Stacks(g, {c.run_id, c.rank, c.generation, c.stored});
  return kUsage;
}

// What the rendered sbatch script calls (hidden from --help).
struct BatchScriptCommands {
  std::string run_id, job_id, allocation, srun_log;
  int64_t step_generation = 0;
  int step_exit_code = 0;
  CLI::App *await_restart, *requeue_wanted, *attach_batch, *attach_requeued, *exclude_failed, *await_silent,
      *step_nodes, *report_step;
  std::vector<CLI::App*> All() const {
    return {await_restart,  requeue_wanted, attach_batch, attach_requeued,
            exclude_failed, await_silent,   step_nodes,   report_step};
  }
};

void DeclareBatchScriptCommands(CLI::App& app, BatchScriptCommands& c) {
  c.await_restart = app.add_subcommand("await-restart", "exit 0 when the run wants another generation");
  c.requeue_wanted = app.add_subcommand("requeue-wanted", "exit 0 when the run waits for its job to be requeued");
  c.attach_batch = app.add_subcommand("attach-batch",
                                      "tell the coordinator the node that runs the run's batch script (a rank requeues "
                                      "or cancels the job if it is lost)");
  c.attach_batch->add_option("--job", c.job_id, "the Slurm job ($SLURM_JOB_ID)")->required();
  c.attach_requeued = app.add_subcommand(
      "attach-requeued", "tell the coordinator Slurm requeued the run's job (a new batch host, a whole allocation)");
  c.attach_requeued->add_option("--job", c.job_id, "the Slurm job ($SLURM_JOB_ID)")->required();
  c.exclude_failed = app.add_subcommand(
      "exclude-failed-nodes", "exclude the nodes Slurm shows failed from the run's job; requeue off excluded ones");
  c.exclude_failed->add_option("--job", c.job_id, "the Slurm job ($SLURM_JOB_ID)")->required();
  c.exclude_failed->add_option("--allocation", c.allocation, "the job's nodes ($SLURM_JOB_NODELIST)")->required();
  c.await_silent = app.add_subcommand("await-silent-node", "give Slurm time to tell whether a silent node is dead");
  c.await_silent->add_option("--allocation", c.allocation, "the job's nodes ($SLURM_JOB_NODELIST)")->required();
  c.step_nodes = app.add_subcommand("step-nodes", "print the nodes of the generation's step (none: all of them)");
  c.report_step = app.add_subcommand("report-step", "report how an srun step ended");
  c.report_step->add_option("--generation", c.step_generation, "the generation the step ran (await-restart printed it)")
      ->required();
  c.report_step->add_option("--exit-code", c.step_exit_code, "srun's exit code")->required();
  c.report_step->add_option("--srun-log", c.srun_log, "srun's stderr")->required();
  for (CLI::App* sub : c.All()) {
    sub->add_option("RUN_ID", c.run_id, "run id (dtctl list shows them)")->required();
    sub->group("");
  }
}

int BatchScriptCommand(Global& g, const BatchScriptCommands& c) {
  if (int code = Connect(g); code != kOk) return code;
  if (c.await_restart->parsed()) return AwaitRestart(g, c.run_id);
  if (c.requeue_wanted->parsed()) return RequeueWanted(g, c.run_id);
  if (c.attach_batch->parsed()) return AttachBatch(g, c.run_id, c.job_id);
  if (c.attach_requeued->parsed()) return AttachRequeued(g, c.run_id, c.job_id);
  if (c.await_silent->parsed()) return AwaitSilentNode(g, c.run_id, c.allocation);
  if (c.exclude_failed->parsed()) return ExcludeFailedNodes(g, c.run_id, c.job_id, c.allocation);
  if (c.step_nodes->parsed()) return StepNodes(g, c.run_id);
  if (c.report_step->parsed()) return ReportStep(g, c.run_id, c.step_generation, c.step_exit_code, c.srun_log);
  return kUsage;
}

CLI::App* DeclareLauncher(CLI::App& app, LocalLaunch& launch) {
  CLI::App* launcher = app.add_subcommand("__launch-local", "internal: the detached local launcher");
  launcher->group("");
  launcher->add_option("--run", launch.run_id)->required();
  launcher->add_option("--trainer", launch.trainer)->required();
  launcher->add_option("--exp-dir", launch.exp_dir)->required();
  launcher->add_option("--nodes", launch.nodes);
  launcher->add_option("--nproc-per-node", launch.procs_per_node);
  launcher->add_option("--omp-threads", launch.omp_threads);
  launcher->add_option("--exec-word", launch.exec_command)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  launcher->add_option("trainer_args", launch.trainer_args)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return launcher;
}

int Launch(const Global& g, LocalLaunch launch) {
  const char* token = std::getenv("DT_RUN_TOKEN");
  launch.run_token = token != nullptr ? token : "";
  launch.coordinator = g.coordinator;
  launch.tls_ca = g.tls_ca;
  return RunLocalLauncher(launch);
}

// A usage error in dtctl's words: an unknown command is named with the list, a missing run id
// points at dtctl list, a trainer flag given before -- says where it goes.
int ExitOnUsageError(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::string what = e.what();
  std::vector<std::string> names;  // the commands --help lists (the batch script's are hidden)
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    known = known || (argc > 1 && sub->get_name() == argv[1]);
    if (!sub->get_group().empty()) names.push_back(sub->get_name());
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::cerr << "dtctl: unknown command \"" << argv[1] << "\" (commands: " << absl::StrJoin(names, ", ")
              << "; see dtctl --help)\n";
    return kUsage;
  }
  if (what == "RUN_ID is required") {
    std::cerr << "dtctl: this command needs a run id, e.g. dtctl status r-0123456789abcdef (dtctl list shows them)\n";
    return kUsage;
  }
  static const char* const kTrainerFlags[] = {
      "--dataset", "--model",     "--max-steps", "--epochs",    "--batch-size", "--seq-len", "--tokenizer-dir",
      "--lr",      "--ckpt-freq", "--log-freq",  "--eval-freq", "--grad-accum", "--seed"};
  for (const char* flag : kTrainerFlags) {
    if (absl::StrContains(what, "not expected") && absl::StrContains(what, flag)) {
      std::cerr << "dtctl: " << flag
                << " is a trainer argument: put it after --, e.g. dtctl submit --name N --save-dir D -- " << flag
                << " VALUE\n";
      return kUsage;
    }
  }
  return dt::ExitOnParseError(app, e, "dtctl", kUsage);
}

}  // namespace
}  // namespace dt::ctl

int main(int argc, char** argv) {
  using namespace dt::ctl;
  // absl's lock-order checking costs a graph update per lock; the tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"dtctl: submit and watch dt training runs (Slurm or local)"};
  app.set_version_flag("--version", std::string(dt::kVersion));
  app.require_subcommand(1);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Global options may also come after the subcommand: `dtctl list -o json`.
  app.fallthrough();
  Global g;
  const char* env_coord = std::getenv("DT_COORDINATOR");
  g.coordinator = env_coord != nullptr && *env_coord != '\0' ? env_coord : "127.0.0.1:50051";
  app.add_option("--coordinator", g.coordinator, "dtcoord address (default: $DT_COORDINATOR, else 127.0.0.1:50051)")
      ->check(dt::HostPort(/*port_zero_ok=*/false));
  app.add_option("--token-file", g.token_file, "token file (default: $DT_TOKEN, else ~/.dt/coord/admin.token)");
  app.add_option("--tls-ca", g.tls_ca, "PEM roots when dtcoord serves TLS");
  app.add_option("-o,--output", g.output, "table or json (metrics: also csv)")
      ->check(CLI::IsMember({"table", "json", "csv"}));
  SubmitCli submit;
  DeclareSubmit(app, submit);
  RunCommands run_commands;
  DeclareRunCommands(app, run_commands);
  BatchScriptCommands batch_script;
  DeclareBatchScriptCommands(app, batch_script);
  LocalLaunch launch;
  CLI::App* launcher = DeclareLauncher(app, launch);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ExitOnUsageError(app, e, argc, argv);
  }
  if (launcher->parsed()) return Launch(g, launch);
  if (submit.command->parsed()) return Submit(g, submit);
  for (CLI::App* sub : batch_script.All()) {
    if (sub->parsed()) return BatchScriptCommand(g, batch_script);
  }
  return RunSubcommand(g, run_commands);
}
