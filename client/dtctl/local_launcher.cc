#include "client/dtctl/local_launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/agent.h"
#include "client/coordinator_client.h"
#include "client/dtctl/run_follower.h"
#include "common/blas_core.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/process_tree.h"
#include "common/run_state.h"
#include "common/subprocess.h"

namespace dt::ctl {
namespace {

struct Child {
  LaunchUnit unit;
  std::unique_ptr<Subprocess> process;
  bool done = false;
  int status = 0;
};

std::string NodeNameFor(const LocalLaunch& l, int node) { return LocalNodeName(l.nodes, node); }

// Tells the coordinator that a process of the current generation died or could not start
// (rank -1 with node and slot: the coordinator maps the slot to its rank; slot -1: a node agent).
void ReportLaunchFailure(CoordinatorClient& client, const LocalLaunch& l, int64_t generation, const LaunchUnit& u,
                         const std::string& message, bool exited) {
  v1::ReportErrorRequest err;
  err.set_run_id(l.run_id);
  err.set_generation(generation);
  err.set_rank(-1);
  err.set_node(NodeNameFor(l, u.node));
  err.set_local_slot(u.slot);
  err.set_host(HostName());
  err.set_process_exited(exited);
  err.set_message(message);
  absl::StatusOr<v1::ReportErrorResponse> r =
      Call(client, &v1::RendezvousService::Stub::ReportError, client.rendezvous(), err, absl::Seconds(10));
  if (!r.ok()) DT_LOG(Warning) << "could not report the failure: " << r.status();
}

// How long the ranks of a failed generation get to leave by themselves before they are stopped.
// (It was 30 s: a rank still registering when its peer died waited that long, found by
// scripts/chaos.sh.)
constexpr absl::Duration kOldGenerationGrace = absl::Seconds(5);
// How often the launcher asks the coordinator for the run while its WatchRun stream is down (and
// sooner after a child dies), and how often while the stream is up: a safety net for a stream
// that stalls without ending.
constexpr absl::Duration kRunQueryInterval = absl::Milliseconds(250);
constexpr absl::Duration kStreamingQueryInterval = absl::Seconds(5);
// How long the processes of a run that succeeded get to exit by themselves.
constexpr absl::Duration kCleanExitGrace = absl::Seconds(5);
// How often the orphans re-parented to the launcher are reaped.
constexpr absl::Duration kReapInterval = absl::Seconds(1);
// How long a run whose every trainer exited 0 may take to succeed.
constexpr absl::Duration kAllDoneWait = absl::Seconds(60);

void StopAll(std::vector<Child>& children, absl::Duration grace) {
  std::vector<Subprocess*> running;
  for (auto& c : children) {
    if (!c.done) running.push_back(c.process.get());
    c.done = true;
  }
  StopProcesses(running, grace);
}

}  // namespace

std::string LocalNodeName(int nodes, int node) {
  // One node: the real node name, as a trainer started by hand would use. Several simulated nodes
  // on one machine: names that sort in node order.
  return nodes == 1 ? NodeName() : absl::StrCat(HostName(), "-node", node);
}

int LocalThreads(int requested, int trainers) {
  if (requested > 0) return requested;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (omp != nullptr && std::atoi(omp) > 0) return std::atoi(omp);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, trainers));
}

std::vector<LaunchUnit> LaunchUnits(const LocalLaunch& l) {
  std::vector<LaunchUnit> units;
  std::vector<int> nodes;  // the simulated nodes this generation starts, in node order
  for (int node = 0; node < l.nodes; ++node) {
    if (l.only_nodes.empty() || absl::c_linear_search(l.only_nodes, NodeNameFor(l, node))) nodes.push_back(node);
  }
  const std::string nnodes = absl::StrCat(nodes.size());
  std::string logs = JoinPath(l.exp_dir, "logs");
  std::map<std::string, std::string> env = {
      {"DT_COORDINATOR", l.coordinator}, {"DT_RUN_ID", l.run_id}, {"DT_RUN_TOKEN", l.run_token}};
  if (!l.tls_ca.empty()) env["DT_TLS_CA"] = l.tls_ca;
  if (!l.openblas_core.empty()) env["OPENBLAS_CORETYPE"] = l.openblas_core;
  if (!l.exec_command.empty()) {
    // torchrun's rule for threads (1 per process when a node runs several) unless the user chose.
    if (l.omp_threads > 0) env["OMP_NUM_THREADS"] = absl::StrCat(l.omp_threads);
    for (int node : nodes) {
      LaunchUnit& u = units.emplace_back();
      u.node = node;
      u.argv = {
          JoinPath(ExecutableDir(), "dtrun"), "--node", NodeNameFor(l, node), "--nnodes", nnodes, "--nproc-per-node",
          absl::StrCat(l.procs_per_node),     "--"};
      u.argv.insert(u.argv.end(), l.exec_command.begin(), l.exec_command.end());
      u.env = env;
      u.log_file = JoinPath(logs, absl::StrCat("dtrun-", NodeNameFor(l, node), ".log"));
    }
    return units;
  }
  env["OMP_NUM_THREADS"] = absl::StrCat(LocalThreads(l.omp_threads, l.nodes * l.procs_per_node));
  for (size_t position = 0; position < nodes.size(); ++position) {
    int node = nodes[position];
    for (int slot = 0; slot < l.procs_per_node; ++slot) {
      LaunchUnit& u = units.emplace_back();
      u.node = node;
      u.slot = slot;
      u.rank = static_cast<int>(position) * l.procs_per_node + slot;
      // The launcher's identity flags come last: dttrainer keeps a flag's last occurrence.
      u.argv = {l.trainer};
      u.argv.insert(u.argv.end(), l.trainer_args.begin(), l.trainer_args.end());
      u.argv.insert(u.argv.end(), {"--node", NodeNameFor(l, node), "--local-rank", absl::StrCat(slot), "--nnodes",
                                   nnodes, "--nproc-per-node", absl::StrCat(l.procs_per_node)});
      u.env = env;
      u.env["LOCAL_RANK"] = absl::StrCat(slot);
      // The user's variables win over dt's defaults (OMP_NUM_THREADS); dt's own names cannot be
      // among them (ValidateRunEnv).
      for (const auto& [k, v] : l.env) u.env[k] = v;
      u.log_file = JoinPath(logs, absl::StrCat("rank-", u.rank, ".log"));
    }
  }
  return units;
}

absl::StatusOr<int> StartLocalLauncher(const LocalLaunch& l) {
  std::vector<std::string> argv = {JoinPath(ExecutableDir(), "dtctl"), "--coordinator", l.coordinator};
  if (!l.tls_ca.empty()) argv.insert(argv.end(), {"--tls-ca", l.tls_ca});
  argv.insert(argv.end(), {"__launch-local", "--run", l.run_id, "--trainer", l.trainer, "--exp-dir", l.exp_dir,
                           "--nodes", absl::StrCat(l.nodes), "--nproc-per-node", absl::StrCat(l.procs_per_node),
                           "--omp-threads", absl::StrCat(l.omp_threads)});
  for (const std::string& word : l.exec_command) argv.insert(argv.end(), {"--exec-word", word});
  argv.push_back("--");
  argv.insert(argv.end(), l.trainer_args.begin(), l.trainer_args.end());
  SpawnOptions o;
  o.env["DT_RUN_TOKEN"] = l.run_token;
  o.output_file = JoinPath(JoinPath(l.exp_dir, "logs"), "launcher.log");
  o.new_session = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv, o);
  if (!p.ok()) return p.status();
  (*p)->Release();
  return static_cast<int>((*p)->pid());
}

namespace {

// The launcher's loop: it follows the run at the coordinator, reaps its children (reporting the
// first to die in the current generation), and starts each new generation once the last is gone.
class Launcher {
 public:
  // The follower wakes the loop with a SIGCHLD sent to the process: every thread blocks the
  // signal (BlockChildSignal ran first), so it waits for the loop's WaitForChildSignal, and a
  // spurious one only makes the loop look at its children once more.
  Launcher(const LocalLaunch& l, std::shared_ptr<CoordinatorClient> client)
      : l_(l), client_(std::move(client)), follower_(client_, l_.run_id, [] { ::kill(::getpid(), SIGCHLD); }) {}

  int Run() {
    follower_.Start();
    // The stream's first snapshot usually arrives within milliseconds: give it one query
    // interval before asking with GetRun.
    last_query_ = absl::Now();
    while (true) {
      if (std::optional<int> code = FollowRun()) return *code;
      ReapChildren();
      ReapInherited();
      // Every trainer finished cleanly: the run should succeed any moment.
      if (all_done_) {
        if (all_done_at_ == absl::InfiniteFuture()) all_done_at_ = absl::Now();
        if (absl::Now() - all_done_at_ > kAllDoneWait) {
          DT_LOG(Error) << "every trainer exited 0 but run " << l_.run_id << " is still "
                        << v1::RunState_Name(run_.state());
          return 1;
        }
      }
      if (!all_done_ && run_.generation() > launched_generation_ && run_.state() != v1::RUN_STATE_UNSPECIFIED) {
        if (std::optional<int> code = StartNextGeneration()) return *code;
      }
      // Wakes at once when a child ends (reaped and reported at the next turn) or the run
      // changes, and otherwise when the next timer of the loop falls due.
      WaitForChildSignal(NextWake() - absl::Now());
    }
  }

 private:
  // What does the coordinator say? An exit code once the launcher is done: the run ended, the
  // coordinator refused the launcher, or it was away too long with no trainer left.
  std::optional<int> FollowRun() {
    // Within one coordinator's life revisions only grow: a snapshot older than the run as last
    // seen (one the stream delivered after a GetRun answered) is dropped. After a coordinator
    // restart they start again from zero: a dropped snapshot makes the launcher ask with GetRun
    // at once, whose answer it always takes.
    if (std::optional<v1::Run> pushed = follower_.Take()) {
      if (pushed->revision() >= run_.revision()) {
        run_ = std::move(*pushed);
        last_reached_ = absl::Now();
      } else {
        last_query_ = absl::Time();  // most likely a restarted coordinator: ask now
      }
    }
    NoteStreamChange();
    if (absl::Now() - last_query_ >= QueryInterval()) {
      v1::GetRunRequest req;
      req.set_run_id(l_.run_id);
      absl::StatusOr<v1::Run> got =
          Call(*client_, &v1::RunService::Stub::GetRun, client_->runs(), req, absl::Seconds(10));
      last_query_ = absl::Now();
      if (got.ok()) {
        run_ = *got;
        last_reached_ = absl::Now();
      } else if (got.status().code() != absl::StatusCode::kUnavailable &&
                 got.status().code() != absl::StatusCode::kDeadlineExceeded) {
        DT_LOG(Error) << "the coordinator refused the launcher: " << got.status();
        StopAll(children_, absl::Seconds(5));
        return 1;
      } else if (!AnyAlive() && absl::Now() - last_reached_ > absl::Minutes(5)) {
        // Trainers give up on an unreachable coordinator after its heartbeat timeout; once they
        // are all gone, so does the launcher (a few minutes, to ride out a restart).
        DT_LOG(Error) << "no trainer left and the coordinator at " << l_.coordinator << " unreachable since "
                      << absl::FormatTime(last_reached_) << ": " << got.status();
        return 1;
      }
    }
    if (IsTerminal(run_.state())) {
      // A run succeeds once its last rank has left; its processes are exiting by then. The stream
      // shows the end at once, so they get a moment to finish before anything is stopped (a
      // dtrun stopped while exiting would log, and report, a stop from outside).
      if (run_.state() == v1::SUCCEEDED) {
        reported_ = true;  // the run is over: an exit now is no failure to report
        AwaitChildren(kCleanExitGrace);
      }
      StopAll(children_, absl::Seconds(10));
      EndLeftovers(absl::Seconds(2));
      DT_LOG(Info) << "run " << l_.run_id << " ended " << v1::RunState_Name(run_.state()) << "; launcher exits";
      return run_.state() == v1::SUCCEEDED ? 0 : 1;
    }
    return std::nullopt;
  }

  absl::Duration QueryInterval() const { return follower_.Streaming() ? kStreamingQueryInterval : kRunQueryInterval; }

  // The earliest of the loop's timers: the next look at the run, the end of the old generation's
  // grace, the next reap of orphans, the end of the wait for a run whose trainers all exited 0.
  absl::Time NextWake() const {
    absl::Time wake = std::min(last_query_ + QueryInterval(), last_reap_ + kReapInterval);
    if (stop_waiting_since_ != absl::InfiniteFuture()) wake = std::min(wake, stop_waiting_since_ + kOldGenerationGrace);
    if (all_done_at_ != absl::InfiniteFuture()) wake = std::min(wake, all_done_at_ + kAllDoneWait);
    return wake;
  }

  // Says in the log when the launcher starts or stops following the run's stream, and why a
  // stream ended: a launcher that asks with GetRun every 250 ms should say why.
  void NoteStreamChange() {
    if (IsTerminal(run_.state())) return;
    bool streaming = follower_.Streaming();
    bool ended = follower_.Ended();
    if (streaming && !streaming_logged_) {
      DT_LOG(Info) << "following run " << l_.run_id << " on its WatchRun stream";
    } else if (!streaming && (streaming_logged_ || (ended && !ended_logged_))) {
      DT_LOG(Warning) << "the run's WatchRun stream ended (" << follower_.LastEnd() << "); asking with GetRun every "
                      << absl::FormatDuration(kRunQueryInterval) << (ended ? "" : " until it is open again");
      ended_logged_ = ended;
    }
    streaming_logged_ = streaming;
  }

  // Reaps children as they end, until none is left or `limit` passes.
  void AwaitChildren(absl::Duration limit) {
    absl::Time until = absl::Now() + limit;
    while (true) {
      ReapChildren();
      if (!AnyAlive() || absl::Now() >= until) return;
      WaitForChildSignal(until - absl::Now());
    }
  }

  bool AnyAlive() const {
    return absl::c_any_of(children_, [](const Child& c) { return !c.done; });
  }

  // Processes of the run that are no longer anyone's tracked child: the rank trees of a dtrun
  // killed with SIGKILL (re-parented here, this launcher being their subreaper, and stopping
  // within their dtslot's grace), or any that escaped. Found by their slot marker and ended.
  void EndLeftovers(absl::Duration grace) {
    int ended = EndMarkedProcesses(MarkerOfRun(l_.run_id), grace);
    if (ended > 0) DT_LOG(Warning) << "ended " << ended << " leftover process(es) of run " << l_.run_id;
  }

  // Reaps, once a second, the orphans re-parented here.
  void ReapInherited() {
    if (absl::Now() - last_reap_ < kReapInterval) return;
    last_reap_ = absl::Now();
    ReapOrphans();  // leaves the trainers and dtruns, whose Subprocess reaps them
  }

  // Reaps trainers; tells the coordinator at once about one that died in the current generation.
  void ReapChildren() {
    all_done_ = !children_.empty();
    for (auto& c : children_) {
      if (!c.done) {
        int status = c.process->Wait(absl::ZeroDuration());
        if (status != -1) Reaped(c, status);
      }
      all_done_ = all_done_ && c.done && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
    }
  }

  void Reaped(Child& c, int status) {
    c.done = true;
    c.status = status;
    bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::string who = c.unit.rank >= 0 ? absl::StrCat("rank ", c.unit.rank)
                                       : absl::StrCat("dtrun of node ", NodeNameFor(l_, c.unit.node));
    DT_LOG(Info) << who << " (pid " << c.process->pid() << ") " << DescribeWaitStatus(status);
    // Exit code 3: stopped by the coordinator, which knows why (or dtrun reported its child).
    bool told_to_stop = WIFEXITED(status) && WEXITSTATUS(status) == 3;
    if (!clean && !told_to_stop && !reported_ && run_.generation() == launched_generation_) {
      reported_ = true;
      ReportLaunchFailure(
          *client_, l_, launched_generation_, c.unit,
          absl::StrCat("pid ", c.process->pid(), " ", DescribeWaitStatus(status), " (see ", c.unit.log_file, ")"),
          /*exited=*/true);
      last_query_ = absl::Time();  // look at the run again now
    }
  }

  // A new generation (first launch, or a restart): once the old group is gone, start the next.
  // An exit code when a process cannot be started.
  std::optional<int> StartNextGeneration() {
    if (AnyAlive()) {
      // Ranks of the old generation are told to stop through their heartbeat and leave within
      // moments; one that never heartbeats (still registering, stopped, hung) is stopped here.
      if (stop_waiting_since_ == absl::InfiniteFuture()) stop_waiting_since_ = absl::Now();
      if (absl::Now() - stop_waiting_since_ > kOldGenerationGrace) {
        StopAll(children_, absl::Seconds(5));
        stop_waiting_since_ = absl::InfiniteFuture();
      }
      return std::nullopt;
    }
    stop_waiting_since_ = absl::InfiniteFuture();
    // The old generation's processes are gone only when none of the run's is left: the next
    // generation must be the only one writing to the experiment. Before this launcher's first
    // generation there is none to look for (it alone starts the run's processes, and it has
    // started nothing yet), so the first skips the scan of /proc (about 5 ms of every launch).
    if (launched_generation_ >= 0) EndLeftovers(kOldGenerationGrace);
    launched_generation_ = run_.generation();
    reported_ = false;
    children_.clear();
    LocalLaunch launch = l_;
    launch.env = {run_.spec().env().begin(), run_.spec().env().end()};  // the run's --env
    launch.only_nodes = {run_.generation_nodes().begin(), run_.generation_nodes().end()};
    DT_LOG(Info) << "starting generation " << launched_generation_ << " (" << run_.world_size() << " ranks"
                 << (launch.only_nodes.empty() ? ""
                                               : absl::StrCat(" on ", launch.only_nodes.size(), " of ", l_.nodes,
                                                              " nodes; lost: ", absl::StrJoin(run_.lost_nodes(), ", ")))
                 << ", restart " << run_.restarts() << " of " << run_.spec().max_restarts() << ")";
    for (LaunchUnit& unit : LaunchUnits(launch)) {
      SpawnOptions o;
      o.env = unit.env;
      o.env[kSlotMarkerEnv] = SlotMarker(
          l_.run_id, launched_generation_,
          unit.rank >= 0 ? absl::StrCat("rank-", unit.rank) : absl::StrCat("node-", NodeNameFor(l_, unit.node)));
      o.output_file = unit.log_file;
      // A launcher that dies (SIGKILL included) stops its trainers and node agents: nothing of the
      // run trains on without it. This is the main thread, which lives as long as the launcher.
      o.parent_death_signal = SIGTERM;
      absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(unit.argv, o);
      if (!p.ok()) {
        DT_LOG(Error) << p.status();
        ReportLaunchFailure(*client_, l_, launched_generation_, unit, std::string(p.status().message()),
                            /*exited=*/false);
        StopAll(children_, absl::Seconds(5));
        return 1;
      }
      Child c;
      c.unit = std::move(unit);
      c.process = std::move(*p);
      children_.push_back(std::move(c));
    }
    return std::nullopt;
  }

  const LocalLaunch& l_;
  std::shared_ptr<CoordinatorClient> client_;
  std::vector<Child> children_;
  int64_t launched_generation_ = -1;
  bool reported_ = false;  // a death in this generation was reported
  bool all_done_ = false;  // every child exited 0
  v1::Run run_;
  absl::Time last_query_;
  absl::Time all_done_at_ = absl::InfiniteFuture();
  absl::Time stop_waiting_since_ = absl::InfiniteFuture();
  absl::Time last_reached_ = absl::Now();
  absl::Time last_reap_;
  bool streaming_logged_ = false;  // what the log last said of the stream
  bool ended_logged_ = false;
  RunFollower follower_;  // last: its thread stops before the rest goes
};

}  // namespace

int RunLocalLauncher(const LocalLaunch& launch) {
  SetLogProgram("dt-launcher");
  BlockChildSignal();  // before gRPC starts its threads: the loop waits for SIGCHLD
  LocalLaunch l = launch;
  // With --exec each node's dtrun chooses for its own workers: loading OpenBLAS here too would
  // only delay the start.
  if (l.exec_command.empty()) {
    l.openblas_core = OpenBlasCoreToSet();
    if (!l.openblas_core.empty()) DT_LOG(Info) << OpenBlasCoreNotice(l.openblas_core);
  }
  absl::StatusOr<std::shared_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect(l.coordinator, l.run_token, l.tls_ca);
  if (!client.ok()) {
    DT_LOG(Error) << client.status();
    return 1;
  }
  int world = l.nodes * l.procs_per_node;
  (void)MakeDirs(JoinPath(l.exp_dir, "logs"));
  // Orphans of the run's processes come here, not to init: found, ended and reaped.
  BecomeChildSubreaper();
  DT_LOG(Info) << "launcher for run " << l.run_id << " (pid " << ::getpid() << "): " << l.nodes << " node(s) x "
               << l.procs_per_node
               << (l.exec_command.empty() ? absl::StrCat(", OMP_NUM_THREADS=", LocalThreads(l.omp_threads, world))
                                          : absl::StrCat(", one dtrun per node running ", l.exec_command.front()));
  return Launcher(l, *client).Run();
}

}  // namespace dt::ctl
