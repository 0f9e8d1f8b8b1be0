#include "client/dtrun/node_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <unistd.h>
#include <cerrno>
#include <cstring>

#include <atomic>
#include <fstream>
#include <future>
#include <optional>
#include <system_error>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/agent.h"
#include "client/dtrun/agent_store.h"
#include "client/dtrun/child_failure.h"
#include "client/dtrun/store_relay.h"
#include "client/dtrun/worker_env.h"
#include "client/node_heartbeats.h"
#include "common/blas_core.h"
#include "common/data_dir.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/log.h"
#include "common/process_tree.h"
#include "common/stack_capture.h"
#include "common/stop_signals.h"
#include "common/subprocess.h"
#include "common/version.h"

namespace dt::run {
namespace {

// dtrun's environment has a WANDB_* variable: the user's program logs to W&B itself.
bool HasWandbSettings() {
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "WANDB_")) return true;
  }
  return false;
}

// Where group rank 0's node publishes MASTER_ADDR:MASTER_PORT in the generation's store.
constexpr char kMasterKey[] = "dtrun/master_endpoint";
constexpr size_t kLogTailBytes = 64 * 1024;
constexpr absl::Duration kSecondaryFailureSettle = absl::Milliseconds(500);
// How late the workers' store may be stamped after a rank and still be named the cause: the two
// watcher threads run in whatever order the scheduler picks, and a rank that lost the store ends
// 5-50 ms after it (StoreEndedFirst).
constexpr absl::Duration kStoreStampSlack = absl::Milliseconds(250);
// How much earlier than the others group rank 0's worker starts when no relay to its store could
// be started (see StartWorkers).
constexpr absl::Duration kRankZeroHeadStart = absl::Milliseconds(50);
// How much longer than its own grace dtrun gives a dtslot to stop its tree before it kills the
// dtslot (whose tree would then escape to dtrun, to be killed by marker).
constexpr absl::Duration kSlotStopMargin = absl::Seconds(5);
// How often the supervisor looks at the node's processes (orphans to reap, idleness) when nothing
// wakes it; until every rank's program is seen, it looks every kFindPrograms.
constexpr absl::Duration kTendInterval = absl::Seconds(1);
constexpr absl::Duration kFindPrograms = absl::Milliseconds(50);

struct Worker {
  std::unique_ptr<Agent> agent;
  std::unique_ptr<Subprocess> process;
  std::string log_file;
  std::string error_file;
  std::string marker;      // DT_SLOT of every process of the rank (common/process_tree.h)
  std::string stacks_dir;  // where its Python processes register for stack captures
  pid_t program_pid = 0;   // the rank's program: its dtslot's child, once seen
  // Idleness of the rank's processes (main thread): their CPU and output at the last look, and
  // since when neither moved.
  uint64_t cpu_ticks = 0;
  int64_t output_bytes = -1;
  absl::Time idle_since = absl::InfiniteFuture();
  bool done = false;
  int status = 0;
  // When the child ended, as its watcher thread saw it the moment it did: when a peer dies, the
  // survivors' collectives fail within milliseconds, so several children end between two sweeps
  // of the supervisor, and only these times say which went first. Guarded by NodeAgent::mu_.
  absl::Time exited_at = absl::InfiniteFuture();
  // The program's wait status, from its dtslot the moment the program ended (dtslot's
  // --status-fd), while the dtslot may still be stopping what the program left for up to the
  // grace: a rank whose program failed first is the cause even when its dtslot ends after the
  // survivors'. Guarded by NodeAgent::mu_.
  std::optional<int> program_status;
  bool program_end_noted = false;  // the supervisor acted on program_status (main thread only)
  std::thread watcher;
};

struct Endpoint {
  std::string addr;
  int port = 0;
  bool agent_store = false;  // group rank 0's dtrun hosts the workers' TCPStore on that port
};

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  std::streamoff size = in.tellg();
  std::streamoff from = size > static_cast<std::streamoff>(bytes) ? size - static_cast<std::streamoff>(bytes) : 0;
  in.seekg(from);
  std::string out(static_cast<size_t>(size - from), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}

// What a dtslot writes to its --status-fd: the program's wait status, then end of file; nothing
// when the dtslot ended first. Closes `fd`.
std::optional<int> ReadProgramStatus(int fd) {
  std::string text;
  char buf[32];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  int status;
  if (!absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(text), &status)) return std::nullopt;
  return status;
}

class NodeAgent {
 public:
  ~NodeAgent() {
    if (heartbeats_) heartbeats_->Stop();  // it acts on the agents, which go below
    // Each watcher ends with its child, and every path out of Run() leaves no child running. The
    // workers' store outlives them until here: it ends (killed and reaped) before its watcher joins.
    agent_store_.reset();
    if (store_watcher_.joinable()) store_watcher_.join();
    for (Worker& w : workers_) {
      if (w.watcher.joinable()) w.watcher.join();
      w.agent.reset();  // its capture thread ends before the directory goes
      if (!w.stacks_dir.empty()) (void)RemoveAll(w.stacks_dir);
    }
  }

  NodeAgent(std::shared_ptr<CoordinatorClient> client, const NodeAgentConfig& config)
      : client_(std::move(client)), config_(config) {
    // Built before the signal handler exists: the vector never changes afterwards.
    for (int slot = 0; slot < config_.procs_per_node; ++slot) {
      AgentOptions o;
      o.run_id = config_.run_id;
      o.node = config_.node;
      o.local_slot = slot;
      o.host = HostName();
      o.pid = ::getpid();
      o.version = kVersion;
      if (config_.nodes > 0) {
        o.expected.set_nodes(config_.nodes);
        o.expected.set_procs_per_node(config_.procs_per_node);
        o.expected.set_world_size(config_.nodes * config_.procs_per_node);
      } else if (config_.counts_procs_per_node) {
        o.expected.set_procs_per_node(config_.procs_per_node);
      }
      Worker& w = workers_.emplace_back();
      w.agent = std::make_unique<Agent>(client_, o);
      w.agent->SetStackCapturer([this, slot] { return CaptureWorker(slot); });
      char dir[] = "/tmp/dt-stacks-XXXXXX";
      if (::mkdtemp(dir) != nullptr) w.stacks_dir = dir;
    }
  }

  int Run() {
    ScopedStopHandler on_signal([this](int signal) { OnStopSignal(signal); });
    // Which OpenBLAS kernels the workers get takes loading OpenBLAS (milliseconds): done while the
    // node waits for its rendezvous.
    // (Run where no thread can be made: the policy lets it be deferred to its get().)
    openblas_core_ = std::async(std::launch::async | std::launch::deferred, OpenBlasCoreToSet);
    if (absl::Status s = Register(); !s.ok()) {
      DT_LOG(Error) << "node " << config_.node << ": registration with run " << config_.run_id << " at "
                    << config_.coordinator << " failed: " << s;
      return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kFailedPrecondition
                 ? kExitUsage
                 : kExitFailed;
    }
    // One stream for the node's ranks: one message per node and interval for the coordinator.
    std::vector<Agent*> agents;
    for (Worker& w : workers_) agents.push_back(w.agent.get());
    heartbeats_ = std::make_unique<NodeHeartbeats>(agents, [this](const std::string& reason) { OnToldToStop(reason); });
    EndEarlierGenerations();
    absl::StatusOr<Endpoint> master = AgreeOnMaster();
    if (!master.ok()) return ReportSetupFailure(absl::StrCat("MASTER_ADDR/MASTER_PORT: ", master.status().message()));
    if (absl::Status s = StartWorkers(*master); !s.ok()) return ReportSetupFailure(std::string(s.message()));
    return Supervise();
  }

 private:
  // One agent per local slot, registered together in one RegisterNode call (the coordinator's
  // cost grows per node, not per rank): the rendezvous answers when every slot of every node has
  // registered.
  absl::Status Register() {
    std::vector<Agent*> agents;
    for (Worker& w : workers_) agents.push_back(w.agent.get());
    if (absl::Status s = Agent::RegisterNode(agents, config_.rendezvous_timeout); !s.ok()) return s;
    registered_ = true;
    LogToTheExperiment();
    const v1::RegisterResponse& a = workers_.front().agent->assignment();
    SetLogProgram(absl::StrCat("dtrun ", config_.node));
    DT_LOG(Info) << "node " << config_.node << " is group rank " << a.node_rank() << " of " << a.nodes() << ": ranks "
                 << workers_.front().agent->rank() << ".." << workers_.back().agent->rank() << " of " << a.world_size()
                 << ", generation " << a.generation() << " (restart " << a.restarts() << " of "
                 << a.spec().max_restarts() << ")";
    return absl::OkStatus();
  }

  // dtrun's log from now on also goes to <exp_dir>/logs/dtrun-NODE.log on the shared file system,
  // unless its stderr is that file already (the local launcher's). Under Slurm, stderr travels
  // through srun on the batch host and is lost with that node: the lines saying what the nodes
  // that remain did about it (a claimed scancel or requeue) with it.
  void LogToTheExperiment() {
    const std::string logs = JoinPath(workers_.front().agent->assignment().exp_dir(), "logs");
    (void)MakeDirs(logs);
    const std::string path = JoinPath(logs, absl::StrCat("dtrun-", config_.node, ".log"));
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      DT_LOG(Warning) << "cannot log to " << path << " (" << std::strerror(errno) << "): this log goes to stderr only";
      return;
    }
    struct stat file = {}, err = {};
    if (::fstat(fd, &file) == 0 && ::fstat(STDERR_FILENO, &err) == 0 && file.st_dev == err.st_dev &&
        file.st_ino == err.st_ino) {
      ::close(fd);
      return;
    }
    AlsoLogTo(fd);  // open for the rest of the process: lines go there until it exits
  }

  // Whatever an earlier generation of the run left on this machine (its dtrun was killed with
  // SIGKILL and its dtslots are still stopping their trees, or a tree escaped) ends before this
  // generation's programs start: only one generation writes to the experiment.
  // Generation 0 has no earlier generation, so its start does without the scan of /proc.
  void EndEarlierGenerations() {
    int64_t generation = workers_.front().agent->generation();
    if (generation == 0) return;
    int ended = EndMarkedProcesses(MarkerBeforeGeneration(config_.run_id, generation), config_.stop_grace);
    if (ended > 0) DT_LOG(Warning) << "ended " << ended << " process(es) an earlier generation of the run left running";
  }

  // Group rank 0's node picks its address and a free port and publishes them in the generation's
  // store; the others read them. Alone in its run, a node publishes to nobody: no store stream.
  absl::StatusOr<Endpoint> AgreeOnMaster() {
    Agent& agent = *workers_.front().agent;
    std::unique_ptr<StoreSession> store;
    if (agent.assignment().nodes() > 1) {
      absl::StatusOr<std::unique_ptr<StoreSession>> opened = agent.OpenStore();
      if (!opened.ok()) return opened.status();
      store = std::move(*opened);
    }
    if (agent.assignment().node_rank() == 0) {
      Endpoint e;
      if (!config_.master_addr.empty()) {
        e.addr = config_.master_addr;
      } else {
        absl::StatusOr<std::string> addr = LocalAddressTowards(config_.coordinator);
        if (!addr.ok()) return addr.status();
        e.addr = *addr;
      }
      absl::StatusOr<std::unique_ptr<AgentStore>> hosted =
          config_.agent_store ? StartAgentStore() : absl::UnimplementedError("not asked for");
      if (hosted.ok()) {
        agent_store_ = std::move(*hosted);
        store_watcher_ = WatchChild(agent_store_->pid(), &store_exited_at_);
        e.port = agent_store_->port();
        e.agent_store = true;
      } else {
        if (config_.agent_store) DT_LOG(Warning) << hosted.status() << "; rank 0's process will host the store";
        absl::StatusOr<int> port = FindFreePort();
        if (!port.ok()) return port.status();
        e.port = *port;
      }
      if (store == nullptr) return e;
      std::string value = absl::StrCat(e.port, " ", e.agent_store ? 1 : 0, " ", e.addr);
      if (absl::Status s = store->Set(kMasterKey, value); !s.ok()) return s;
      return e;
    }
    absl::StatusOr<std::string> value = store->Get(kMasterKey, config_.rendezvous_timeout);
    if (!value.ok()) return value.status();
    // "PORT AGENT_STORE ADDR": the address goes last, whatever it holds.
    Endpoint e;
    std::vector<std::string> parts = absl::StrSplit(*value, absl::MaxSplits(' ', 2));
    int agent_store = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &e.port) || !absl::SimpleAtoi(parts[1], &agent_store)) {
      return absl::DataLossError(absl::StrCat("the store's ", kMasterKey, " holds \"", *value, "\""));
    }
    e.agent_store = agent_store != 0;
    e.addr = parts[2];
    return e;
  }

  absl::Status StartWorkers(const Endpoint& master) {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const char* python_path = std::getenv("PYTHONPATH");
    std::string dt_python = FindDtPythonDir().value_or("");
    std::string openblas_core = openblas_core_.get();
    if (!openblas_core.empty()) DT_LOG(Info) << OpenBlasCoreNotice(openblas_core);
    StartStoreRelay(master);
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::AbortedError("stopped before the workers started");
    for (Worker& w : workers_) {
      const v1::RegisterResponse& a = w.agent->assignment();
      // Rank 0 hosts the store at MASTER_PORT; the node's other ranks reach it through the relay.
      const int master_port = store_relay_ && a.rank() != 0 ? store_relay_->port() : master.port;
      std::string logs = JoinPath(a.exp_dir(), "logs");
      (void)MakeDirs(logs);
      w.log_file = JoinPath(logs, absl::StrCat("rank-", a.rank(), ".log"));
      w.error_file = JoinPath(logs, absl::StrCat("rank-", a.rank(), ".error.json"));
      ::unlink(w.error_file.c_str());  // a previous generation's
      WorkerContext c{a,
                      w.agent->incarnation(),
                      master.addr,
                      master_port,
                      master.agent_store,
                      config_.coordinator,
                      config_.tls_ca,
                      config_.run_token,
                      w.error_file,
                      omp != nullptr ? omp : "",
                      dt_python,
                      python_path != nullptr ? python_path : "",
                      openblas_core,
                      w.stacks_dir,
                      static_cast<int>(::getpid()),
                      [](const std::string& name) { return std::getenv(name.c_str()) != nullptr; },
                      HasWandbSettings()};
      SpawnOptions o;
      o.env = WorkerEnvironment(c);
      if (auto dir = o.env.find("WANDB_DIR"); dir != o.env.end()) (void)MakeDirs(dir->second);
      w.marker = SlotMarker(config_.run_id, a.generation(), absl::StrCat("rank-", a.rank()));
      o.env[kSlotMarkerEnv] = w.marker;
      o.output_file = w.log_file;
      // The rank's tree is kept by a dtslot, which stops it whole; dtrun's own death (SIGKILL
      // included) stops it too. This is the main thread, which lives as long as dtrun.
      o.parent_death_signal = SIGTERM;
      // The program's status comes back the moment it ends (dtslot's --status-fd).
      int status_pipe[2];
      if (::pipe2(status_pipe, O_CLOEXEC) != 0) return ErrnoStatus("make", "a pipe for the rank's status", errno);
      o.keep_fd = status_pipe[1];
      // The times of the output's chunks go beside the log, for `dtctl logs --all`.
      std::vector<std::string> argv = {JoinPath(ExecutableDir(), "dtslot"),
                                       "--grace",
                                       absl::StrCat(absl::ToDoubleSeconds(config_.stop_grace)),
                                       "--times",
                                       absl::StrCat(w.log_file, ".times"),
                                       "--status-fd",
                                       absl::StrCat(status_pipe[1]),
                                       "--"};
      argv.insert(argv.end(), config_.command.begin(), config_.command.end());
      std::ofstream(w.log_file, std::ios::app)
          << "dtrun: rank " << a.rank() << " of " << a.world_size() << ", generation " << a.generation() << " (restart "
          << a.restarts() << "), MASTER_ADDR=" << master.addr << " MASTER_PORT=" << master_port
          << (master_port != master.port ? absl::StrCat(" (dtrun's relay to rank 0's store on ", master.port, ")") : "")
          << ": " << absl::StrJoin(config_.command, " ") << "\n";
      absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv, o);
      ::close(status_pipe[1]);  // the dtslot's alone now: its end of file is the dtslot's end
      if (!p.ok()) {
        ::close(status_pipe[0]);
        return p.status();
      }
      w.process = std::move(*p);
      w.watcher = WatchChild(w.process->pid(), &w.exited_at, status_pipe[0], &w.program_status);
      DT_LOG(Info) << "rank " << a.rank() << ": pid " << w.process->pid() << ", output to " << w.log_file;
      if (a.rank() == 0 && !master.agent_store && !store_relay_ && workers_.size() > 1) {
        // Without the relay (its address could not be bound here): a rank whose connection is
        // refused because rank 0 is not listening yet waits a whole second before it tries
        // again (torch 1.13's client), and two identical `import torch` end within ~10 ms of
        // each other, so a short head start makes rank 0 listen first most of the time.
        // (A stop asked meanwhile is handled once all are started, as one asked during the loop.)
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRankZeroHeadStart);
      }
    }
    return absl::OkStatus();
  }

  // A thread that notes the moment child `pid` ends in `*exited_at` (guarded by mu_) and wakes the
  // supervisor. WNOWAIT: the supervisor reaps; this only notes the moment. It ends with the child.
  // With a dtslot's status pipe (`status_fd`, closed here), it first notes the moment the rank's
  // program ends and its status in `*program_status`, and wakes the supervisor then too.
  // A thread that cannot be made (the node out of threads or memory) leaves the child to the
  // supervisor's own sweeps, at least once a second, rather than end dtrun with its ranks.
  std::thread WatchChild(pid_t pid, absl::Time* exited_at, int status_fd = -1,
                         std::optional<int>* program_status = nullptr) {
    try {
      return StartWatcher(pid, exited_at, status_fd, program_status);
    } catch (const std::system_error& e) {
      DT_LOG(Warning) << "no watcher thread for pid " << pid << " (" << e.what()
                      << "): its end is seen at the next look, within a second";
      if (status_fd >= 0) ::close(status_fd);
      return std::thread();
    }
  }
  std::thread StartWatcher(pid_t pid, absl::Time* exited_at, int status_fd, std::optional<int>* program_status) {
    return std::thread([this, pid, exited_at, status_fd, program_status] {
      if (status_fd >= 0) {
        std::optional<int> status = ReadProgramStatus(status_fd);
        if (status) {
          absl::Time now = absl::Now();
          {
            absl::MutexLock lock(&mu_);
            *program_status = status;
            *exited_at = std::min(*exited_at, now);
          }
          WakeSupervisor();
        }
      }
      siginfo_t info;
      while (::waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
      }
      absl::Time now = absl::Now();
      {
        absl::MutexLock lock(&mu_);
        *exited_at = std::min(*exited_at, now);
      }
      WakeSupervisor();
    });
  }

  // On group rank 0's node, when rank 0's program hosts the workers' store and the node runs
  // other ranks: they connect through a relay that is listening before any of them starts
  // (client/dtrun/store_relay.h), so none waits out torch's one-second retry. Ranks on other
  // nodes connect to MASTER_PORT directly.
  void StartStoreRelay(const Endpoint& master) {
    const v1::RegisterResponse& a = workers_.front().agent->assignment();
    if (a.node_rank() != 0 || master.agent_store || workers_.size() < 2) return;
    absl::StatusOr<std::unique_ptr<StoreRelay>> relay = StoreRelay::Start(master.addr, master.port, master.port);
    if (!relay.ok()) {
      DT_LOG(Warning) << "no relay to rank 0's TCPStore (" << relay.status().message()
                      << "): the node's other ranks connect to it directly, a little after rank 0 starts";
      return;
    }
    store_relay_ = std::move(*relay);
    DT_LOG(Info) << "rank 0's program hosts the workers' TCPStore on port " << master.port
                 << "; this node's other ranks reach it through the relay on port " << store_relay_->port();
  }

  // Waits for the children: every one exits 0 → each rank leaves and dtrun exits 0; one fails →
  // it is reported and the others stopped; the coordinator says stop → the children are stopped.
  int Supervise() {
    Worker* failed = nullptr;  // the first child that failed, reported once its settle time passed
    while (true) {
      std::vector<std::pair<Worker*, int>> leaving;  // a rank whose child ended well, and the preemption signal
      bool all_done = true;
      bool all_clean = true;
      bool stopped_before = false;  // a stop (a signal from outside, a failure) under way before this sweep
      // The store is looked at before the ranks: stamped after them, a rank that lost it would
      // look like the first to end.
      bool store_ended = agent_store_ && agent_store_->Ended().has_value();
      {
        absl::MutexLock lock(&mu_);
        if (store_ended) store_exited_at_ = std::min(store_exited_at_, absl::Now());
        stopped_before = stopping_;
        for (Worker& w : workers_) {
          if (!w.done) {
            int status = w.process->Wait(absl::ZeroDuration());
            if (status != -1) {
              w.done = true;
              w.status = status;
              w.exited_at = std::min(w.exited_at, absl::Now());
              bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
              DT_LOG(Info) << "rank " << w.agent->rank() << " (pid " << w.process->pid() << ") "
                           << DescribeWaitStatus(status);
              // A child that exits 0 after the signal checkpointed on its own: preempted as well.
              if (clean || Preempted(status)) leaving.push_back({&w, PreemptionRequested() ? SIGUSR2 : 0});
              if (IsFailure(status)) ConsiderFailure(w, status, failed);
            } else if (w.program_status && !w.program_end_noted && IsFailure(*w.program_status)) {
              w.program_end_noted = true;
              // The program failed; its dtslot is still stopping what the program left running.
              DT_LOG(Info) << "rank " << w.agent->rank() << "'s program " << DescribeWaitStatus(*w.program_status)
                           << "; its keeper (pid " << w.process->pid() << ") is stopping what it left running";
              ConsiderFailure(w, *w.program_status, failed);
            }
          }
          all_done = all_done && w.done;
          all_clean = all_clean && w.done && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
        }
        if (failed != nullptr) stopping_ = true;
      }
      for (auto [w, preempted_by] : leaving) {
        heartbeats_->Drop(w->agent.get());
        if (absl::Status s = w->agent->Leave(0, preempted_by); !s.ok()) {
          DT_LOG(Warning) << "rank " << w->agent->rank() << " ended but could not tell the coordinator: " << s;
        }
      }
      if (!stopped_before && !StopReason()) {
        if (std::optional<std::string> gone = StoreEndedFirst(failed, all_done)) return ReportSetupFailure(*gone);
      }
      if (failed != nullptr && absl::Now() >= ReportTime(*failed)) {
        // Told to stop meanwhile: another node's report failed the generation first.
        if (!StopReason()) ReportFailure(*failed);
        StopWorkers();
        return kExitStopped;
      }
      if (std::optional<std::string> reason = StopReason()) {
        DT_LOG(Warning) << "stopping the workers: " << *reason;
        StopWorkers();
        return kExitStopped;
      }
      if (all_done && failed == nullptr) return all_clean || PreemptionRequested() ? kExitOk : kExitStopped;
      TendTrees();
      absl::Time next = programs_known_ ? last_tended_ + kTendInterval : absl::Now() + kFindPrograms;
      if (failed != nullptr) next = std::min(next, ReportTime(*failed));
      WaitForWake(next);
    }
  }

  // Slurm's SIGUSR2 (preemption, time limit) ended a program that does not handle it: the rank
  // leaves as preempted, so the run is requeued rather than failed.
  bool Preempted(int status) { return PreemptionRequested() && WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR2; }
  bool IsFailure(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !Preempted(status); }

  // A rank's program ended with `status`, a failure: the first to end is the cause, and the others
  // most likely failed because it did. Not once a stop is under way (their failures are its).
  void ConsiderFailure(Worker& w, int status, Worker*& failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopping_ || (failed != nullptr && failed->exited_at <= w.exited_at)) return;
    w.status = status;
    failed = &w;
  }

  // The workers' store went away under them (they cannot form their group, nor finish a store
  // call) before any of them failed: it is the cause, and the ranks that fail within milliseconds
  // for want of it are not. Its watcher wakes the supervisor the moment it ends. Nothing a rank
  // does ends the store, so a rank stamped up to kStoreStampSlack before it (its watcher ran
  // first) still gives way to it. Not during a stop from outside or a preemption: the store
  // ignores their signals, and a store ended then is not what stopped the ranks.
  std::optional<std::string> StoreEndedFirst(const Worker* failed, bool all_done) {
    if (!agent_store_ || (all_done && failed == nullptr)) return std::nullopt;
    if (stopped_from_outside_.load() || PreemptionRequested()) return std::nullopt;
    std::optional<int> ended = agent_store_->Ended();
    if (!ended) return std::nullopt;
    absl::MutexLock lock(&mu_);
    store_exited_at_ = std::min(store_exited_at_, absl::Now());
    if (failed != nullptr && failed->exited_at + kStoreStampSlack < store_exited_at_) return std::nullopt;
    return absl::StrCat("the workers' TCPStore (dtrun-store, pid ", agent_store_->pid(), ", port ",
                        agent_store_->port(), ") ", DescribeWaitStatus(*ended), " while ranks still needed it");
  }

  // A child's end (its watcher thread) or a word to stop (a heartbeat thread) wakes the
  // supervisor at once; it does not poll for them.
  void WakeSupervisor() ABSL_LOCKS_EXCLUDED(wake_mu_) {
    absl::MutexLock lock(&wake_mu_);
    wake_ = true;
  }
  void WaitForWake(absl::Time deadline) ABSL_LOCKS_EXCLUDED(wake_mu_, mu_) {
    absl::MutexLock lock(&wake_mu_);
    wake_mu_.AwaitWithDeadline(absl::Condition(&wake_), deadline);
    wake_ = false;
  }

  // Once a second: reaps the orphans the rank trees left here (dtrun is their subreaper), and
  // tells the coordinator which process runs each rank's program (the dtslot's child), so `dtctl
  // status` shows the pid to look at. One look at /proc serves every rank and the orphans: its
  // cost grows with the node's processes, and a node of 8 ranks looked 9 times a second.
  void TendTrees() {
    bool due = absl::Now() - last_tended_ >= kTendInterval;
    if (!due && programs_known_) return;
    if (due) {
      last_tended_before_ = last_tended_ == absl::Time() ? absl::Now() : last_tended_;
      last_tended_ = absl::Now();
    }
    const std::vector<ProcessInfo> all = AllProcesses();  // outside the lock: file-system work
    {
      absl::MutexLock lock(&mu_);
      programs_known_ = true;
      for (Worker& w : workers_) {
        if (!w.process) continue;
        if (w.done || (!due && w.program_pid != 0)) continue;
        std::vector<pid_t> tree = Descendants(w.process->pid(), all);
        if (!tree.empty() && tree.front() != w.program_pid) {
          w.program_pid = tree.front();
          w.agent->SetWorkerPid(static_cast<int>(w.program_pid));
        }
        programs_known_ = programs_known_ && w.program_pid != 0;
        if (due) MeasureIdle(w, tree, all);
      }
    }
    if (!due) return;
    ReapOrphans(all);  // leaves the children a Subprocess owns (workers, the store, a stack capture)
  }

  // A rank is idle while its processes neither print (its log does not grow) nor use CPU (under 1%
  // of a core since the last look); the coordinator judges how long is too long.
  void MeasureIdle(Worker& w, const std::vector<pid_t>& tree, const std::vector<ProcessInfo>& all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time now = absl::Now();
    uint64_t cpu = CpuTicks(tree, all);
    struct stat st;
    int64_t output = ::stat(w.log_file.c_str(), &st) == 0 ? st.st_size : 0;
    absl::Duration since_last = now - last_tended_before_;
    double cpu_seconds = static_cast<double>(cpu - std::min(cpu, w.cpu_ticks)) / ClockTicksPerSecond();
    bool busy = w.output_bytes < 0 || output != w.output_bytes || cpu < w.cpu_ticks ||
                cpu_seconds >= 0.01 * absl::ToDoubleSeconds(since_last);
    w.cpu_ticks = cpu;
    w.output_bytes = output;
    if (busy) {
      w.idle_since = absl::InfiniteFuture();
    } else if (w.idle_since == absl::InfiniteFuture()) {
      w.idle_since = last_tended_before_;
    }
    w.agent->SetIdle(w.idle_since == absl::InfiniteFuture() ? absl::ZeroDuration() : now - w.idle_since);
  }

  // The stacks of slot `slot`'s processes (everything under its dtslot), for the coordinator's
  // capture: Python frames from processes the hook registered, native frames from the others.
  v1::RankStacks CaptureWorker(int slot) {
    v1::RankStacks out;
    pid_t keeper = 0;
    std::string hooks;
    {
      absl::MutexLock lock(&mu_);
      const Worker& w = workers_[slot];
      if (!w.process || w.done) {
        out.set_error("the rank's program is not running");
        return out;
      }
      keeper = w.process->pid();
      hooks = w.stacks_dir;
    }
    std::vector<pid_t> tree = Descendants(keeper);
    if (tree.empty()) {
      out.set_error("no process is left under the rank's keeper");
      return out;
    }
    StackCaptureOptions o;
    o.python_hooks_dir = hooks;
    for (v1::ProcessStacks& p : CaptureProcessStacks(tree, o)) *out.add_processes() = std::move(p);
    return out;
  }

  // A child killed by a signal (SIGKILL, SIGSEGV, the OOM killer) is reported at once. One that
  // exited with an error code or aborted waits out a settle time first: when a peer dies, the
  // survivors' collectives fail within milliseconds and they exit with errors of their own, and
  // the peer's node must get its report in first — the first report is the run's root cause.
  absl::Time ReportTime(const Worker& w) {
    absl::MutexLock lock(&mu_);
    bool primary = WIFSIGNALED(w.status) && WTERMSIG(w.status) != SIGABRT;
    return primary ? w.exited_at : w.exited_at + kSecondaryFailureSettle;
  }

  void ReportFailure(const Worker& w) {
    std::string exit =
        absl::StrCat("pid ", w.process->pid(), " ", DescribeWaitStatus(w.status), "; output in ", w.log_file);
    ChildFailure f = DescribeChildFailure(w.error_file, Tail(w.log_file, kLogTailBytes), exit);
    DT_LOG(Error) << "rank " << w.agent->rank()
                  << " failed: " << (f.exception_type.empty() ? "" : absl::StrCat(f.exception_type, ": ")) << f.message;
    if (absl::Status s = w.agent->ReportWorkerExit(f.message, f.exception_type, f.stack, 0); !s.ok()) {
      DT_LOG(Warning) << "could not report the failure of rank " << w.agent->rank() << ": " << s;
    }
  }

  // SIGTERM to every child still running, SIGKILL after the grace.
  void StopWorkers() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    std::vector<Worker*> running;
    std::vector<Subprocess*> processes;
    for (Worker& w : workers_) {
      if (!w.process || w.done) continue;
      running.push_back(&w);
      processes.push_back(w.process.get());
    }
    std::vector<int> statuses = StopProcesses(processes, config_.stop_grace + kSlotStopMargin);
    for (size_t k = 0; k < running.size(); ++k) {
      running[k]->done = true;
      running[k]->status = statuses[k];
    }
    // A tree whose dtslot was killed before it finished is re-parented here; nothing of the
    // node's ranks outlives this.
    std::vector<std::string> markers;
    for (const Worker& w : workers_) {
      if (!w.marker.empty()) markers.push_back(w.marker);
    }
    if (!markers.empty()) EndMarkedProcesses(MarkerIn(markers), absl::ZeroDuration());
  }

  // A child that could not start, no master endpoint, or the workers' store lost while they ran:
  // the node's ranks cannot run.
  int ReportSetupFailure(const std::string& message) {
    DT_LOG(Error) << message;
    (void)workers_.front().agent->ReportError(message, "", "", 0, /*fatal=*/false);
    StopWorkers();
    return kExitStopped;
  }

  // From a heartbeat thread: the coordinator says stop (a peer failed, a restart, a cancel).
  void OnToldToStop(const std::string& reason) {
    {
      absl::MutexLock lock(&stop_mu_);
      if (!stop_reason_) stop_reason_ = reason;
    }
    WakeSupervisor();
  }
  std::optional<std::string> StopReason() {
    absl::MutexLock lock(&stop_mu_);
    return stop_reason_;
  }

  // From the signal watcher: this node was stopped from outside (srun ending the step after
  // another node failed, scancel, a time limit). Its ranks are victims: say so, forward the
  // signal, and let the watcher end dtrun by the same signal.
  void OnStopSignal(int signal) {
    stopped_from_outside_ = true;
    DT_LOG(Warning) << "stopped by " << SignalName(signal) << " from outside; stopping the workers";
    if (registered_) {
      for (Worker& w : workers_) (void)w.agent->ReportStopped(signal, 0, absl::Seconds(2));
    }
    StopWorkers();
  }

  std::shared_ptr<CoordinatorClient> client_;
  NodeAgentConfig config_;
  std::vector<Worker> workers_;                 // one per local slot, fixed at construction
  std::unique_ptr<NodeHeartbeats> heartbeats_;  // from registration on
  std::future<std::string> openblas_core_;      // OpenBlasCoreToSet(), asked as Run starts
  std::atomic<bool> registered_{false};
  absl::Time last_tended_;                   // main thread only
  bool programs_known_ = false;              // every worker's program pid was seen (main thread only)
  absl::Time last_tended_before_;            // the look before (idleness is measured between the two)
  std::unique_ptr<AgentStore> agent_store_;  // on group rank 0's node, for the children's lifetime
  std::thread store_watcher_;                // notes its end (WatchChild)
  std::unique_ptr<StoreRelay> store_relay_;  // likewise, when rank 0's program hosts the store
  absl::Mutex mu_;  // the children: reaped by the main loop, stopped by it or the signal watcher
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time store_exited_at_ = absl::InfiniteFuture();  // as Worker::exited_at, for the store; guarded by mu_
  std::atomic<bool> stopped_from_outside_{false};        // OnStopSignal began
  absl::Mutex stop_mu_;
  std::optional<std::string> stop_reason_ ABSL_GUARDED_BY(stop_mu_);
  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;  // something for the supervisor to look at
};

}  // namespace

int RunNodeAgent(std::shared_ptr<CoordinatorClient> client, const NodeAgentConfig& config) {
  // Orphans of the node's rank trees come here, not to init: they stay findable and are reaped.
  BecomeChildSubreaper();
  return NodeAgent(std::move(client), config).Run();
}

}  // namespace dt::run
