// dtrun: the per-node agent that runs a user's own program under dt. See `dtrun --help`.

#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/coordinator_client.h"
#include "client/dtrun/node_agent.h"
#include "client/join_run.h"
#include "common/cli_checks.h"
#include "common/env.h"
#include "common/host.h"
#include "common/log.h"
#include "common/procs_per_node.h"
#include "common/stop_signals.h"
#include "common/subprocess.h"
#include "common/version.h"

namespace {

int Usage(const std::string& message) {
  std::cerr << "dtrun: " << message << " (see dtrun --help)\n";
  return dt::run::kExitUsage;
}

// What the command line sets beside the agent's configuration.
struct Flags {
  std::string token_file;
  std::string procs_per_node = "1";  // a count, or gpu|cpu|auto counted here
  dt::JoinRunSpec join;
  double rendezvous_timeout_s = 600;
  double stop_grace_s = 10;
};

void DeclareFlags(CLI::App& app, dt::run::NodeAgentConfig& c, Flags& f) {
  c.coordinator = dt::Env("DT_COORDINATOR");
  c.run_id = dt::Env("DT_RUN_ID");
  c.tls_ca = dt::Env("DT_TLS_CA");
  c.node = dt::NodeName();
  c.agent_store = dt::EnvInt("DT_AGENT_STORE", 0) == 1;
  app.add_option("--coordinator", c.coordinator, "dtcoord address HOST:PORT (default: $DT_COORDINATOR)");
  app.add_option("--run", c.run_id, "run id (default: $DT_RUN_ID)");
  app.add_option("--token-file", f.token_file, "file holding the token (default: $DT_RUN_TOKEN, else $DT_TOKEN)");
  app.add_option("--tls-ca", c.tls_ca, "PEM roots to verify a TLS coordinator (default: $DT_TLS_CA)");
  app.add_option("--node", c.node, "node name ranks are grouped by (default: $SLURMD_NODENAME, else the host name)");
  app.add_option("--nnodes", c.nodes, "nodes of the run; refused if the run disagrees (default: the run's)")
      ->check(dt::AtLeast(1));
  app.add_option("--nproc-per-node", f.procs_per_node,
                 "processes to start on this node: a count, or as torchrun: gpu (one per GPU this node's "
                 "processes can see), cpu (one per CPU they may run on), auto (gpu where there are GPUs, else cpu)")
      ->check(dt::ProcsPerNodeValue())
      ->capture_default_str();
  app.add_option("--master-addr", c.master_addr,
                 "MASTER_ADDR to publish when this node is group rank 0 (default: the address of the interface "
                 "that reaches the coordinator)");
  app.add_flag("--agent-store", c.agent_store,
               "host the workers' c10d TCPStore in a helper, as torchrun's agent does "
               "(TORCHELASTIC_USE_AGENT_STORE=True; also DT_AGENT_STORE=1): saves workers a one-second connect "
               "retry, but only for workers that import the same torch version as the system LibTorch dt was built "
               "with");
  app.add_option("--rendezvous-timeout", f.rendezvous_timeout_s, "seconds to wait for every rank to register")
      ->capture_default_str();
  app.add_option("--stop-grace", f.stop_grace_s, "seconds between SIGTERM and SIGKILL when the children are stopped")
      ->capture_default_str();
  app.add_option("--experiment-name", f.join.experiment_name,
                 "without --run: create or join the run of this experiment and Slurm job");
  app.add_option("--save-dir", f.join.save_dir, "without --run: where the experiment directory goes");
  app.add_option("--max-restarts", f.join.max_restarts, "without --run: restarts the created run allows");
  app.add_option("command", c.command, "the program and its arguments, after --")->required();
}

// Without --run (the user's own sbatch script): the run of this experiment and Slurm job, created
// by whichever node comes first. An exit code when there is none.
std::optional<int> JoinRun(dt::CoordinatorClient& client, dt::run::NodeAgentConfig& c, dt::JoinRunSpec join,
                           const dt::ProcsPerNode& procs) {
  if (!c.run_id.empty()) return std::nullopt;
  if (join.experiment_name.empty() || join.save_dir.empty() || c.nodes <= 0) {
    return Usage(
        "no run: pass --run (or DT_RUN_ID), or --experiment-name, --save-dir and --nnodes to create or join one");
  }
  join.nodes = c.nodes;
  join.procs_per_node = procs.count;  // 0 for a rule: every node counts its own
  join.procs_per_node_rule = procs.rule;
  join.exec_command = c.command;
  absl::StatusOr<std::string> run = dt::CreateOrJoinRun(client, join);
  if (!run.ok()) {
    std::cerr << "dtrun: cannot create or join the run for experiment " << join.experiment_name << ": " << run.status()
              << "\n";
    return run.status().code() == absl::StatusCode::kUnavailable ? dt::run::kExitFailed : dt::run::kExitUsage;
  }
  c.run_id = *run;
  return std::nullopt;
}

// --nproc-per-node gpu|cpu|auto: this node's count. A node that cannot count (gpu without a
// visible GPU) ends the run: the coordinator hears why (restarting would find the same node), and
// the launcher sees exit code 2. An exit code when it cannot.
std::optional<int> CountProcsPerNode(dt::CoordinatorClient& client, dt::run::NodeAgentConfig& c,
                                     const dt::ProcsPerNode& procs) {
  absl::StatusOr<int> count = dt::ResolveProcsPerNode(procs, dt::ProbeThisNode(), c.node);
  if (count.ok()) {
    c.procs_per_node = *count;
    c.counts_procs_per_node = !procs.rule.empty();
    if (c.counts_procs_per_node) DT_LOG(Info) << "--nproc-per-node " << procs.rule << ": " << *count << " on this node";
    return std::nullopt;
  }
  std::cerr << "dtrun: " << count.status().message() << "\n";
  dt::v1::GetRunRequest get;
  get.set_run_id(c.run_id);
  absl::StatusOr<dt::v1::Run> run =
      dt::Call(client, &dt::v1::RunService::Stub::GetRun, client.runs(), get, absl::Seconds(30));
  if (run.ok()) {
    dt::v1::ReportErrorRequest report;
    report.set_run_id(c.run_id);
    report.set_generation(run->generation());
    report.set_rank(-1);
    report.set_node(c.node);
    report.set_local_slot(-1);  // no process was started
    report.set_host(dt::HostName());
    report.set_message(std::string(count.status().message()));
    report.set_fatal(true);
    auto reported =
        dt::Call(client, &dt::v1::RendezvousService::Stub::ReportError, client.rendezvous(), report, absl::Seconds(30));
    if (!reported.ok()) run = reported.status();
  }
  if (!run.ok()) std::cerr << "dtrun: could not tell the coordinator: " << run.status() << "\n";
  return dt::run::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  dt::BlockStopSignals();  // before any thread: SIGTERM/SIGINT go to the watcher (forwarded to the children)
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  dt::SetLogProgram("dtrun");
  CLI::App app{
      "dtrun: runs your own training program under dt, one process per slot of this node, with the\n"
      "environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...),\n"
      "so a torchrun-style script runs unchanged. Started by `dtctl submit --exec -- CMD ARGS...` (local or\n"
      "Slurm), or in your own sbatch script as\n"
      "  srun --ntasks-per-node=1 dtrun --coordinator H:P --experiment-name NAME --save-dir DIR \\\n"
      "      --nnodes $SLURM_NNODES --nproc-per-node 4 -- python3 train.py --lr 3e-4\n"
      "with DT_TOKEN set. Output goes to <experiment dir>/logs/rank-<R>.log."};
  app.set_version_flag("--version", std::string(dt::kVersion));
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  dt::run::NodeAgentConfig c;
  Flags f;
  DeclareFlags(app, c, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dt::ExitOnParseError(app, e, "dtrun", dt::run::kExitUsage);
  }
  dt::WatchStopSignals();
  dt::WatchPreemptionSignal();  // SIGUSR2 reaches the children from Slurm itself; dtrun notes it
  if (c.coordinator.empty()) return Usage("no coordinator: pass --coordinator HOST:PORT or set DT_COORDINATOR");
  if (f.rendezvous_timeout_s <= 0 || f.stop_grace_s < 0) {
    return Usage("--rendezvous-timeout must be positive and --stop-grace not negative");
  }
  c.rendezvous_timeout = absl::Seconds(f.rendezvous_timeout_s);
  c.stop_grace = absl::Seconds(f.stop_grace_s);
  if (absl::Status s = dt::CheckExecutable(c.command.front()); !s.ok()) {
    return Usage(absl::StrCat("cannot run the command: ", s.message()));
  }
  absl::StatusOr<std::string> token = dt::ResolveRunToken(f.token_file);
  if (!token.ok()) return Usage("no token: set DT_RUN_TOKEN (from dtctl submit) or DT_TOKEN, or pass --token-file");
  c.run_token = *token;
  absl::StatusOr<std::shared_ptr<dt::CoordinatorClient>> client =
      dt::CoordinatorClient::Connect(c.coordinator, c.run_token, c.tls_ca);
  if (!client.ok()) return Usage(std::string(client.status().message()));
  dt::ProcsPerNode procs = *dt::ParseProcsPerNode(f.procs_per_node);  // the validator accepted it
  if (std::optional<int> code = JoinRun(**client, c, f.join, procs)) return *code;
  if (std::optional<int> code = CountProcsPerNode(**client, c, procs)) return *code;
  return dt::run::RunNodeAgent(*client, c);
}
