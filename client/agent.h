// The trainer side of the coordinator (like TSL's coordination agent): register and wait for the
// rendezvous, heartbeat from a thread (and learn when to stop), barriers, checkpoint rounds,
// error reports, leaving. Calls that are safe to repeat are retried while the coordinator is
// briefly unreachable (a restart), within the call's own timeout.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/node_relay.h"
#include "client/store_combiner.h"
#include "client/store_session.h"
#include "common/host.h"
#include "dt/v1/stacks.pb.h"

namespace dt {

struct AgentOptions {
  std::string run_id;
  std::string node;  // SLURMD_NODENAME, else the host name
  int local_slot = 0;
  std::string host;
  int pid = 0;
  std::string version;
  v1::WorldView expected;             // all zero: accept the run's shape
  std::optional<int> scheduler_task;  // SLURM_PROCID under srun
  // Ranks of one node share barrier outcomes (client/node_relay.h) and carry each other's store adds
  // (client/store_combiner.h) in memory; DT_NODE_RELAY=0 in the environment turns both off.
  bool node_relay = true;
};

class NodeHeartbeats;

class Agent {
 public:
  Agent(std::shared_ptr<CoordinatorClient> client, AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // For a program started by dtrun (`dtctl submit --exec`): acts for the rank dtrun registered,
  // from the environment dtrun set (DT_COORDINATOR, DT_RUN_TOKEN, DT_RUN_ID, DT_GENERATION,
  // DT_INCARNATION, DT_TIMEOUTS, DT_EXPERIMENT_DIR, DT_LATEST_CHECKPOINT, RANK, WORLD_SIZE,
  // LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE). No Register call: assignment()
  // is filled from those. FAILED_PRECONDITION naming what is missing when not started by dtrun.
  static absl::StatusOr<std::unique_ptr<Agent>> AttachToDtrun();

  // Registers with a fresh incarnation and waits for every rank (up to `timeout`).
  absl::StatusOr<v1::RegisterResponse> Register(absl::Duration timeout);
  // Registers every agent of one node (same client, run and node) in one RegisterNode call, as a
  // node agent speaks for its ranks: one call and one answer per node for the coordinator. Each
  // agent then holds its assignment as Register would have given it. UNIMPLEMENTED (saying to
  // upgrade) from a dtcoord older than RegisterNode.
  static absl::Status RegisterNode(const std::vector<Agent*>& agents, absl::Duration timeout);
  const v1::RegisterResponse& assignment() const { return assignment_; }
  int rank() const { return assignment_.rank(); }
  int world_size() const { return assignment_.world_size(); }
  int64_t generation() const { return assignment_.generation(); }
  const std::string& incarnation() const { return incarnation_; }
  const std::string& run_id() const { return options_.run_id; }
  const v1::TimeoutPolicy& timeouts() const { return assignment_.timeouts(); }
  const std::shared_ptr<CoordinatorClient>& client() const { return client_; }

  // Heartbeats every policy interval from a thread. `on_stop(reason)` is called once, on that
  // thread, when the coordinator says stop, refuses this process (replaced, old generation), or
  // cannot be reached for the heartbeat timeout.
  // A node agent heartbeats all of its node's agents on one stream instead (NodeHeartbeats).
  void StartHeartbeats(std::function<void(const std::string& reason)> on_stop);
  void StopHeartbeats();
  // The last finished step (and the total, when known), sent with the next heartbeat.
  void ReportProgress(int64_t step, int64_t total_steps);
  // The process doing this rank's work, when it is not this one (dtrun's child); sent with each
  // heartbeat so `dtctl status` shows the pid to look at.
  void SetWorkerPid(int pid) { worker_pid_ = pid; }
  // How long the rank's processes have neither printed nor used CPU (dtrun measures it for the
  // user's program); sent with each heartbeat for the coordinator's idle check.
  void SetIdle(absl::Duration idle) { idle_ms_ = absl::ToInt64Milliseconds(idle); }

  // Captures this rank's stacks when a heartbeat reply asks (HeartbeatResponse.capture_id): the
  // capturer runs on a thread of its own, so heartbeats go on meanwhile, and its answer goes back
  // with ReportStacks (the agent fills in rank, node, host and timing). Set before Register: the
  // registration says that this process captures.
  using StackCapturer = std::function<v1::RankStacks()>;
  void SetStackCapturer(StackCapturer capturer) { capturer_ = std::move(capturer); }

  // Zero timeouts mean the run's policy. Barriers travel on a store session this agent keeps open
  // for them (the release is a write on an open stream, not a call's completion); a session broken
  // by a coordinator restart is opened again and the arrival repeated with the same sequence.
  // With more than one rank on the node, the node's ranks share the outcome through a NodeRelay:
  // the coordinator answers the node's first arrival, which wakes the others.
  absl::Status Barrier(const std::string& name, absl::Duration timeout = absl::ZeroDuration());
  // `sharded`: every rank writes its own files into the reply's partial_dir (every rank asks alike).
  absl::StatusOr<v1::BeginCheckpointResponse> BeginCheckpoint(int64_t step,
                                                              absl::Duration timeout = absl::ZeroDuration(),
                                                              bool sharded = false);
  // The writer passes its manifest; the others pass nullptr and wait for the commit. In a sharded
  // round every rank passes the manifest of its own files (ManifestOfFiles) and may pass the
  // layout document (JSON) that manifest.json publishes.
  absl::StatusOr<v1::CheckpointInfo> CommitCheckpoint(const std::string& round_id, const v1::Manifest* manifest,
                                                      const std::string& layout_json = "");
  absl::Status AbortCheckpoint(const std::string& round_id, const std::string& reason);
  // `fatal`: restarting cannot help (full disk, bad configuration); the run fails now.
  absl::Status ReportError(const std::string& message, const std::string& exception_type, const std::string& stack,
                           int64_t step, bool fatal = false);
  // The process doing this rank's work exited (dtrun's child): `message` says how; an exception
  // type, when the child left one, makes it a reported error rather than a bare exit.
  absl::Status ReportWorkerExit(const std::string& message, const std::string& exception_type, const std::string& stack,
                                int64_t step);
  // This process was stopped by `signal` from outside (a victim, not a cause). One attempt within
  // `timeout`: a scheduler sends SIGKILL a few seconds after SIGTERM. No-op before registration.
  absl::Status ReportStopped(int signal, int64_t step, absl::Duration timeout);
  // This rank's device pre-flight; the reply's `unhealthy` is set when the generation failed
  // because of a pre-flight (this rank's or another's).
  absl::StatusOr<v1::ReportPreflightResponse> ReportPreflight(const v1::DevicePreflight& result);
  // `preempted_by`: the signal with which the scheduler asked the job to stop (SIGUSR2), after
  // the checkpoint at `final_step` every rank agreed on; 0 for a run that is done.
  absl::Status Leave(int64_t final_step, int preempted_by = 0);
  absl::StatusOr<std::unique_ptr<StoreSession>> OpenStore();
  // The node's store combiner for this rank (client/store_combiner.h): null with one rank on the
  // node, with the node relay turned off (DT_NODE_RELAY=0), or when it cannot be opened (logged);
  // the store then sends its adds itself.
  std::unique_ptr<StoreCombiner> OpenStoreCombiner();

 private:
  friend class NodeHeartbeats;  // heartbeats for this rank as HeartbeatLoop would

  // A request about this rank: the run, the generation, the rank and this process's incarnation.
  template <typename Request>
  Request RankRequest() const {
    Request r;
    r.set_run_id(options_.run_id);
    r.set_generation(generation());
    r.set_rank(rank());
    r.set_incarnation(incarnation_);
    return r;
  }
  v1::ReportErrorRequest ErrorRequest(const std::string& message, const std::string& exception_type,
                                      const std::string& stack, int64_t step) const;
  v1::RegisterRequest RegistrationRequest() const;
  absl::Status SendError(const v1::ReportErrorRequest& request);
  void HeartbeatLoop(std::function<void(const std::string&)> on_stop);
  // Starts the capture the coordinator asked for (once per id), on its own thread.
  void StartCapture(const std::string& capture_id);
  void CaptureAndReport(const std::string& capture_id);
  // This node's relay, opened on first use; null without one.
  NodeRelay* RelayLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(barrier_mu_);
  // A relay member's arrival: counted by the coordinator, the outcome from the node's holder.
  // `again`: a retry after the store session broke, so the arrival is sent whatever the ticket says.
  absl::StatusOr<uint64_t> AwaitRelay(StoreSession& session, NodeRelay& relay, const NodeRelay::Ticket& ticket,
                                      const std::string& name, uint64_t sequence, absl::Duration timeout,
                                      absl::Time deadline, bool again);
  // Repeats `call` while it returns UNAVAILABLE, until `deadline`.
  template <typename F>
  auto RetryUnavailable(absl::Time deadline, F call) -> decltype(call(absl::Duration()));

  std::shared_ptr<CoordinatorClient> client_;
  AgentOptions options_;
  std::string incarnation_;
  v1::RegisterResponse assignment_;
  std::atomic<bool> registered_{false};  // assignment_ is set (read by the signal watcher)
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> total_steps_{0};
  std::atomic<int> worker_pid_{0};
  std::atomic<int64_t> idle_ms_{0};
  StackCapturer capturer_;
  std::string last_capture_;  // the heartbeat thread only (this agent's, or its NodeHeartbeats')
  std::thread capture_thread_;
  std::atomic<bool> capture_done_{true};
  absl::Mutex barrier_mu_;
  std::map<std::string, uint64_t> barrier_sequences_ ABSL_GUARDED_BY(barrier_mu_);
  std::shared_ptr<StoreSession> barrier_session_ ABSL_GUARDED_BY(barrier_mu_);
  std::unique_ptr<NodeRelay> relay_ ABSL_GUARDED_BY(barrier_mu_);
  bool relay_tried_ ABSL_GUARDED_BY(barrier_mu_) = false;
  std::atomic<bool> stopped_{false};      // the heartbeat loop was told to stop
  std::atomic<uint64_t> link_breaks_{0};  // failed heartbeats: a relay waiter arrives again
  absl::Notification stop_heartbeats_;
  std::thread heartbeat_thread_;
};

// Whether the job's time limit, rather than a preemption, sent the stop signal at `now`. The
// batch script exports the job's end (DT_JOB_END_TIME, seconds since the epoch; empty without a
// limit) and how long before it Slurm signals (DT_PREEMPT_GRACE). Slurm sends the signal up to a
// minute early; a preemption comes at any time, so one within the last grace + minute reads as
// the time limit.
bool NearTheJobsTimeLimit(absl::Time now);

}  // namespace dt
