// Helpers shared by the tests: temporary directories, child processes, and a coordinator served
// in-process on a loopback port.
#pragma once

#include <signal.h>

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/agent.h"
#include "client/coordinator_client.h"
#include "common/subprocess.h"
#include "coordinator/embedded.h"
#include "coordinator/observers.h"

struct sqlite3;

namespace dt::testing {

// A fresh directory under $TMPDIR, removed when the object dies (unless DT_KEEP_TEST_DIRS is set).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const;

 private:
  std::string path_;
};

using dt::Subprocess;

// Path of a binary built by this project (build/bin/<name>).
std::string BinaryPath(const std::string& name);
// The tree's data/ (tokenizer files, Alpaca and Shakespeare samples; see data/README.md). Tests
// read nothing outside the clone.
std::string DataDir();

// Reads a file; "" if it is missing.
std::string Slurp(const std::string& path);
// Reads a pipe (or any descriptor) to its end, and closes it.
std::string ReadToEnd(int fd);

// The mask of one "Sig...:" line ("SigIgn:", "SigBlk:", "SigCgt:") of /proc/PID/status text;
// a test failure if the line is missing.
uint64_t SignalMask(const std::string& proc_status, absl::string_view field);
// Whether `mask` (as SignalMask reads it) holds signal `sig`.
bool MaskHas(uint64_t mask, int sig);

// The dtrun above `pid` (a rank's program or its dtslot), by parent links; 0 if there is none.
pid_t NodeAgentOf(pid_t pid);
// The workers' store (dtrun-store, DT_AGENT_STORE=1) that dtrun `agent` started; 0 if none.
pid_t WorkersStoreOf(pid_t agent);

// Polls `condition` every 20 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout);

// Makes the work on paths that contain a given part wait, as on a disk or file server that
// stopped answering: Pass() (from a product's test hook) waits until Release() or for at most
// `max_wait` (a test that fails leaves nothing waiting for long).
class Stall {
 public:
  void Arm(const std::string& part, absl::Duration max_wait = absl::Seconds(5));
  void Pass(const std::string& path);
  int stalled();  // calls of Pass() that waited, ever
  int waiting();  // calls of Pass() waiting now
  void Release();

 private:
  absl::Mutex mu_;
  std::string part_ ABSL_GUARDED_BY(mu_);
  absl::Duration max_wait_ ABSL_GUARDED_BY(mu_) = absl::Seconds(5);
  int stalled_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification released_;
};

// Holds the write lock of a coordinator's state database (<state_dir>/dtcoord.db) from a
// connection of its own (SQLite's locking), as a disk that stalls every write would, until
// Release() or destruction. Waits up to 10 s for a write in progress; held() tells.
class StateDbWriteLock {
 public:
  explicit StateDbWriteLock(const std::string& state_dir);
  ~StateDbWriteLock();
  StateDbWriteLock(const StateDbWriteLock&) = delete;
  StateDbWriteLock& operator=(const StateDbWriteLock&) = delete;
  bool held() const { return held_; }
  void Release();

 private:
  sqlite3* db_ = nullptr;
  bool held_ = false;
};

// A coordinator observer that holds every metric delivery until Release(), as a W&B spool on a
// stalled disk would, counting the batches handed to it.
class HeldMetricObserver : public RunObserver {
 public:
  void OnRunChanged(const v1::Run&) override {}
  void OnMetrics(const v1::Run&, const v1::MetricBatch&) override;
  void Release();
  int delivered();  // batches handed over (the one being held included)

 private:
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int delivered_ ABSL_GUARDED_BY(mu_) = 0;
};

// The dtcoord binary on 127.0.0.1:<free port> with its own state dir, for end-to-end tests.
class CoordinatorProcess;

// `count` ranks of `run_id` on one node (`node`, host "host", slots 0..count-1, pid 100 + slot),
// registered concurrently; ordered by rank.
std::vector<std::unique_ptr<Agent>> RegisterAgents(const std::shared_ptr<CoordinatorClient>& client,
                                                   const std::string& run_id, const std::string& node, int count);

// Runs a binary of this build (dtctl, dtcoord, dttrainer) with `args` and `env` added to the
// environment; fails the test when it cannot be run at all (a timeout included).
CommandResult RunBinary(const std::string& name, const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& env = {}, absl::Duration timeout = absl::Minutes(4));

// Runs dtctl (of this build) against `coord` with its admin token; `env` adds or overrides
// variables (HOME, another token). Fails the test when dtctl cannot be run at all.
CommandResult RunDtctl(const CoordinatorProcess& coord, const std::vector<std::string>& args,
                       std::map<std::string, std::string> env = {});
// The JSON dtctl printed on stdout (the combined output may hold stderr notes first); a
// discarded value when there is none.
nlohmann::json DtctlJson(const CommandResult& result);
// The value of `series` (its name and labels, as exposed) in a Prometheus text exposition; 0 when
// it is not there (a counter that never counted is not exposed).
double MetricValue(const std::string& exposition, const std::string& series);

class CoordinatorProcess {
 public:
  CoordinatorProcess(const std::string& dir, std::vector<std::string> extra_args = {},
                     std::map<std::string, std::string> env = {});
  // kill -9, then start again on the same state dir and address (trainers reconnect).
  void KillAndRestart() { StopAndRestart(SIGKILL); }
  // Sends `signal` (SIGTERM: the graceful drain of a systemd restart), waits for the exit, stays
  // away for `away`, then starts again on the same state dir and address.
  void StopAndRestart(int signal, absl::Duration away = absl::ZeroDuration());
  // "host:port" of /metrics, when started with --metrics-listen.
  std::string metrics_address() const;
  ~CoordinatorProcess();
  const std::string& address() const { return address_; }
  const std::string& admin_token() const { return admin_token_; }
  const std::string& state_dir() const { return state_dir_; }
  const std::string& log() const { return log_; }
  Subprocess& process() { return *process_; }
  std::shared_ptr<CoordinatorClient> Client(const std::string& token) const;
  std::shared_ptr<CoordinatorClient> AdminClient() const { return Client(admin_token_); }
  // Submits a run and returns (run id, run token).
  v1::SubmitRunResponse Submit(const v1::RunSpec& spec) const;
  v1::Run GetRun(const std::string& run_id) const;
  // Every stored value of `metric` for the run, ordered by step then rank.
  std::vector<v1::MetricRecord> Metrics(const std::string& run_id, const std::string& metric,
                                        std::optional<int> rank = std::nullopt) const;

 private:
  std::string state_dir_;
  std::string log_;
  std::string address_;
  std::string admin_token_;
  std::vector<std::string> extra_args_;
  std::map<std::string, std::string> env_;
  std::unique_ptr<Subprocess> process_;
  void Launch(const std::string& listen);
};

// dttrainer's arguments for the tiny model on the tree's Alpaca sample, sequences of 64 tokens,
// every step logged: what the tests' runs train, before their own flags (a later flag wins).
std::vector<std::string> TinyModelArgs();

// Starts nodes × procs dttrainer processes of a run (nodes named n1..nN), output to
// <log_dir>/<run>-rank<i>.log, with the tiny model on the tree's Alpaca sample plus `args`.
std::vector<std::unique_ptr<Subprocess>> StartTrainers(const CoordinatorProcess& coord,
                                                       const v1::SubmitRunResponse& run, int nodes, int procs,
                                                       const std::vector<std::string>& args,
                                                       const std::string& log_dir);
std::string TrainerLog(const std::string& log_dir, const v1::SubmitRunResponse& run, int index);

// What a trainer's pre-flight line says of its BLAS on this machine: "(OpenBLAS <core> kernels)"
// with dt's choice where OpenBLAS's own pick is older than the CPU (common/blas_core.h), else
// OpenBLAS's pick. Empty when this process's environment sets OPENBLAS_CORETYPE (the trainers
// then run what it says).
std::string ExpectedOpenBlasKernels();

// The largest absolute difference between the tensors of experiments `a`'s and `b`'s checkpoints
// at `step`, both under `save_dir` (`dttrainer ckpt-diff`); fails the test, and returns a huge
// value, when the tool does.
double CheckpointMaxAbsDiff(const std::string& save_dir, const std::string& a, const std::string& b, int step);

// The run `resumed` (resumed after step `from`) reported rank 0's losses of steps from+1..`to`
// only, each bit for bit the loss the run `straight`, which never stopped, reported at that step.
void ExpectResumedLossesMatch(const CoordinatorProcess& coord, const std::string& straight_run,
                              const std::string& resumed_run, int from, int to);

// Submits experiment `name` and trains it with dttrainer `args`, expecting exit code `code` (the
// ranks and the device are the caller's choice); returns the submission.
using TrainRun =
    std::function<v1::SubmitRunResponse(const std::string& name, const std::vector<std::string>& args, int code)>;

// A run of `args` (`steps` steps, a checkpoint at `crash_step`) that vanishes after that checkpoint
// (--exit-after-step) and is resumed ends bit for bit where one that never stopped ends: every
// loss after the crash, and the checkpoints at `steps` and at `crash_step` (the straight run copied
// that one while its next step ran). Experiments `name`-straight and `name`-crashed.
void ExpectResumeAfterACrashIsExact(const CoordinatorProcess& coord, const std::string& save_dir,
                                    const std::string& log_dir, const std::string& name,
                                    const std::vector<std::string>& args, int crash_step, int steps,
                                    const TrainRun& train);

// Every logged loss of `run` within `relative` of `reference`'s at the same step, `points` of each;
// returns the largest relative difference.
double ExpectLossesClose(const CoordinatorProcess& coord, const std::string& reference, const std::string& run,
                         double relative, size_t points);

// A RunSpec with the given shape, saving under `save_dir`.
v1::RunSpec MakeSpec(const std::string& name, const std::string& save_dir, int nodes, int procs_per_node,
                     int max_restarts = 0);

}  // namespace dt::testing
