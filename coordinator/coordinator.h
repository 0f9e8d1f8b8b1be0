// The coordinator's logic, free of gRPC so tests can drive it with a fake clock: runs and their
// state machine, rendezvous, the per-generation key-value store and barriers, health (heartbeats,
// reported errors, the hang watchdog), experiment directories, checkpoint leadership and metric
// ingestion. The *_service.cc files translate RPCs to these calls.
//
// Threading: one registry lock and one lock per run (registry → run, never the reverse); the
// key-value store has its own lock. Calls that wait (Register, Barrier, BeginCheckpoint,
// CommitCheckpoint, store get/wait) take a Pending and never block the calling thread; replies
// are delivered after every lock is released.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/limits.h"
#include "common/timeout_policy.h"
#include "coordinator/barrier_table.h"
#include "coordinator/checkpoint_publisher.h"
#include "coordinator/clock.h"
#include "coordinator/elastic.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/file_work.h"
#include "coordinator/health_tracker.h"
#include "coordinator/kv_store.h"
#include "coordinator/observers.h"
#include "coordinator/pending.h"
#include "coordinator/preflight_judge.h"
#include "coordinator/rank_admission.h"
#include "coordinator/rendezvous.h"
#include "coordinator/run_mutex.h"
#include "coordinator/state_db.h"
#include "coordinator/timer_queue.h"
#include "dt/v1/barrier.pb.h"
#include "dt/v1/checkpoint.pb.h"
#include "dt/v1/experiment.pb.h"
#include "dt/v1/metrics.pb.h"
#include "dt/v1/rendezvous.pb.h"
#include "dt/v1/runs.pb.h"
#include "dt/v1/stacks.pb.h"
#include "dt/v1/store.pb.h"

namespace dt {

class DirFd;

struct CoordinatorOptions {
  CoordinatorTimeouts timeouts;
  int64_t max_keys_per_run = kMaxKeysPerRun;
  int64_t store_bytes_per_run = kDefaultStoreBytesPerRun;    // keys plus values, one run
  int64_t store_bytes_total = kDefaultStoreBytesTotal;       // every run together
  size_t max_barrier_names = kMaxBarrierNames;               // distinct barrier names, one generation
  int64_t metric_bytes_per_run = kDefaultMetricBytesPerRun;  // metric batches held for storage, one run
  int64_t max_ranks = kDefaultMaxRanks;                      // ranks of every run not yet ended
  PreflightPolicy preflight;                                 // when a rank's device pre-flight makes it unhealthy
  // What a commit checks before publishing: sizes (the writer's digests are recorded and checked
  // by whoever loads the checkpoint), or a full re-read of every byte.
  CheckpointVerification checkpoint_verification = CheckpointVerification::kSizes;
  std::string version = "dev";
  // How often heartbeat and hang checks run (also flushes rank progress to the database).
  absl::Duration health_check_period = absl::Milliseconds(250);
  // Tests only: called with the experiment directory before each piece of file work on it
  // (SubmitRun's preparation, run.json, a round's partial directory; "<exp_dir> (retention)"
  // before a retention pass), off every lock; a test stalls it to show that one run's slow save
  // dir slows no other run, and that a retention pass holds up no round's Begin.
  std::function<void(const std::string& exp_dir)> before_file_work;
  // Tests only: called before each pass that stores metric batches, off every lock.
  std::function<void()> before_metric_pass;
};

// Who is calling, once the token was checked.
struct Principal {
  bool admin = false;
  std::string run_id;  // the run a run token belongs to
};

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options, const Clock* clock, TimerQueue* timers, StateDb* db);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Loads every run from the database. Runs that were active keep their generation and ranks;
  // their trainers have a full heartbeat timeout to reconnect. Partial checkpoint directories of
  // active runs are removed.
  absl::Status Load();
  // Starts the periodic health check on the timer queue.
  void Start();
  // Fails every waiting call with UNAVAILABLE (the server is going away), refuses new metric
  // batches (UNAVAILABLE), stops the checks, and waits for the file work in flight: checkpoint
  // verifications (they notify observers when they finish), metric storage, progress flushes.
  void Shutdown();
  // Returns once the file work posted so far has run: checkpoint publication, the removal of
  // retired checkpoints and aborted rounds, run.json, metric storage and progress flushes.
  void AwaitFileWork();

  const CoordinatorOptions& options() const { return options_; }
  v1::TimeoutPolicy policy() const { return policy_; }
  void AddObserver(RunObserver* observer);
  // Not owned; set before Start().
  void SetStats(CoordinatorStats* stats) { stats_ = stats; }

  // Counts for the coordinator's health metrics.
  struct Census {
    std::map<v1::RunState, int> runs_by_state;
    int registered_ranks = 0;             // ranks holding an assignment in active runs
    int64_t metric_batches_unstored = 0;  // accepted, not yet stored and delivered
    int64_t admitted_ranks = 0;           // held against --max-ranks (RankAdmission)
  };
  Census TakeCensus() const;

  // ---- Auth -------------------------------------------------------------------------------
  // The run whose token has this SHA-256, if any.
  std::optional<std::string> RunForTokenDigest(const std::string& token_sha256) const;
  // OK for the admin and for the run's own token; PERMISSION_DENIED otherwise.
  static absl::Status Authorize(const Principal& who, const std::string& run_id);
  static absl::Status RequireAdmin(const Principal& who, absl::string_view what);

  // ---- Runs -------------------------------------------------------------------------------
  absl::StatusOr<v1::SubmitRunResponse> SubmitRun(const v1::RunSpec& spec);
  absl::StatusOr<v1::Run> GetRun(const std::string& run_id);
  // A page of runs, newest first (ListRuns' contract in runs.proto): at most `limit` (0: no limit)
  // and kMaxListRunsPageBytes; `page_token` continues after a previous page.
  struct RunPage {
    std::vector<v1::Run> runs;
    std::string next_page_token;  // empty: no run follows
  };
  absl::StatusOr<RunPage> ListRuns(int limit, const std::vector<v1::RunState>& states,
                                   const std::string& page_token = "");
  absl::StatusOr<v1::Run> CancelRun(const std::string& run_id, const std::string& reason);
  absl::StatusOr<v1::Run> AttachLaunch(const v1::AttachLaunchRequest& request);
  // Adds failed nodes to the run's excluded nodes, each with a NODE_FAILED record.
  absl::StatusOr<v1::Run> ExcludeNodes(const v1::ExcludeNodesRequest& request);
  absl::StatusOr<v1::Experiment> GetExperiment(const std::string& run_id);

  // Watchers get a snapshot at once, then every change. The last update has `done` set: after
  // the run ended (end OK), or when the coordinator shuts down (end UNAVAILABLE).
  struct WatchUpdate {
    std::optional<v1::RunEvent> event;
    bool done = false;
    absl::Status end;
  };
  using WatchCallback = std::function<void(const WatchUpdate& update)>;
  absl::StatusOr<uint64_t> Watch(const std::string& run_id, bool include_metrics, WatchCallback callback);
  void Unwatch(const std::string& run_id, uint64_t watch_id);

  // ---- Rendezvous ---------------------------------------------------------------------------
  // Register, RegisterNode and their withdrawals (rank_registration.h): RendezvousService calls it
  // directly.
  class RankRegistration;
  RankRegistration& registration() { return *registration_; }

  // ---- Health ----------------------------------------------------------------------------
  // Heartbeats, reported errors, stops, pre-flights, leaving and the watchdog (health_monitor.h):
  // RendezvousService and the health thread call it directly.
  class HealthMonitor;
  HealthMonitor& health() { return *health_; }

  // ---- Store and barriers -----------------------------------------------------------------
  // A generation's key-value store and barriers (store_barriers.h): StoreService, BarrierService
  // and the store's operations call it directly.
  class StoreAndBarriers;
  StoreAndBarriers& store_barriers() { return *store_barriers_; }
  const StoreAndBarriers& store_barriers() const { return *store_barriers_; }

  // ---- Stacks -----------------------------------------------------------------------------
  // Hang evidence and on-demand captures (stack_captures.h): StacksService calls it directly.
  class StackCaptures;
  StackCaptures& stacks() { return *stacks_; }

  // ---- Checkpoints ------------------------------------------------------------------------
  // Rounds, their commit and retention (checkpoint_leadership.h): CheckpointService calls it directly.
  class CheckpointLeadership;
  CheckpointLeadership& checkpoints() { return *checkpoints_; }

  // ---- Metrics ----------------------------------------------------------------------------
  // Metric batches from their acceptance to their storage and delivery, and their history
  // (metric_pipeline.h): MetricsService and the console call it directly.
  using MetricsStored = std::function<void(const absl::Status&)>;
  class MetricPipeline;
  MetricPipeline& metrics() { return *metrics_; }

 private:
  // The coordinator and its run lookup, which every manager starts from (manager_base.h).
  class ManagerBase;
  // The run's record, rank rows, progress and run.json, written off its lock (run_persistence.h).
  class RunPersistence;
  struct CheckpointRound;
  struct Generation;
  struct CaptureInProgress;
  // The run's progress (record and rank table) as of `sequence`, for a write off the run's lock.
  struct ProgressSnapshot {
    uint64_t sequence = 0;
    StoredRun stored;
    v1::RankProgress progress;
    std::optional<std::vector<v1::RankStatus>> rows;  // when a rank's record changed since the last write
  };
  // One run's state; every field but the mutex is guarded by it. Defined here (not with the other
  // parts in coordinator_internal.h) so clang's thread-safety analysis sees `mu` in the
  // ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu) contracts below.
  struct RunEntry : std::enable_shared_from_this<RunEntry> {
    RunMutex mu;
    StoredRun stored ABSL_GUARDED_BY(mu);
    std::vector<v1::Failure> failures ABSL_GUARDED_BY(mu);
    std::vector<v1::CheckpointInfo> checkpoints ABSL_GUARDED_BY(mu);  // committed by this run, by step
    std::unique_ptr<Generation> gen ABSL_GUARDED_BY(mu);
    std::map<int64_t, std::string> ended_generations ABSL_GUARDED_BY(mu);  // generation → why it ended
    // Completed stack captures whose database row is not written yet (GetStacks shows them too).
    std::vector<v1::StackCapture> unsaved_captures ABSL_GUARDED_BY(mu);
    struct Watcher {
      bool metrics = false;
      WatchCallback callback;
    };
    std::map<uint64_t, Watcher> watchers ABSL_GUARDED_BY(mu);
    // Counts the changes announced to watchers and observers (v1::Run.revision): events are
    // delivered after the lock is released and may overtake each other.
    uint64_t revision ABSL_GUARDED_BY(mu) = 0;
    // Shared with observers (Prometheus, W&B) so a metric batch does not copy the run.
    std::shared_ptr<const v1::Run> observed ABSL_GUARDED_BY(mu);
    // Orders the run's SQLite writes. Each snapshot of the record or the ranks takes the next
    // sequence under `mu`; a write whose snapshot is older than the one last written is skipped.
    // Every write happens off `mu`: state changes after the lock is released (Deferred::AddWrite),
    // the periodic progress flush on the file-work queue (a disk that stalls writes must not
    // stall the heartbeats and store calls that take `mu`).
    uint64_t persist_sequence ABSL_GUARDED_BY(mu) = 0;
    // Ranks this run holds of the coordinator's --max-ranks (RankAdmission), until it ends.
    int64_t ranks_admitted ABSL_GUARDED_BY(mu) = 0;
    // Bytes of this run's metric batches accepted and not yet stored and delivered (taken without
    // `mu`), against CoordinatorOptions::metric_bytes_per_run.
    std::atomic<int64_t> metric_bytes_held{0};
    // The newest progress snapshot no flush task has taken yet. A flush posts a task only when
    // none waits, so a stalled disk leaves one snapshot per run queued, not one per period.
    std::shared_ptr<ProgressSnapshot> unwritten_progress ABSL_GUARDED_BY(mu);
    absl::Mutex persist_mu ABSL_ACQUIRED_AFTER(mu);
    uint64_t record_written ABSL_GUARDED_BY(persist_mu) = 0;
    uint64_t ranks_written ABSL_GUARDED_BY(persist_mu) = 0;
    uint64_t progress_written ABSL_GUARDED_BY(persist_mu) = 0;
  };

  // A run's lock and the replies decided under it. The destructor releases the lock first and
  // then delivers, so a reply (or an observer it wakes) never runs under the run's lock — the rule
  // as a type rather than a declaration order.
  class ABSL_SCOPED_LOCKABLE LockedRun {
   public:
    explicit LockedRun(RunEntry& run) ABSL_EXCLUSIVE_LOCK_FUNCTION(run.mu) : run_(run) { run_.mu.Lock(); }
    ~LockedRun() ABSL_UNLOCK_FUNCTION() {
      run_.mu.Unlock();
      deferred_.RunNow();
    }
    LockedRun(const LockedRun&) = delete;
    LockedRun& operator=(const LockedRun&) = delete;
    Deferred& deferred() { return deferred_; }

   private:
    RunEntry& run_;
    Deferred deferred_;
  };

  using RunPtr = std::shared_ptr<RunEntry>;

  absl::StatusOr<RunPtr> FindRun(const std::string& run_id) const;
  std::vector<RunPtr> AllRuns() const;

  // State machine (run lock held).
  // Makes generation `number` on `shape`'s nodes (empty: the run's full size), recording its size
  // in the run (world_size, generation_nodes, lost_nodes, generations). Without a shape: the
  // shape the run records (a coordinator restart, a generation made again at the same number).
  void NewGeneration(RunEntry& run, int64_t number, const NextNodes& shape) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  void NewGeneration(RunEntry& run, int64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // A Slurm run's job was requeued: it has a whole allocation again. An elastic run's next
  // generation that was shrunk to the nodes the old allocation had left, and has not formed, is
  // made again at the same number on the run's full size; anything waiting in it is answered
  // ABORTED.
  void WholeAgainAfterRequeue(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Elastic runs: the nodes the generation after a failure forms on (run.gen, not yet ended).
  // `silent`: SilentNodes(run) for a heartbeat timeout, else empty (the failure lost no node).
  NextNodes ElasticNextNodes(const RunEntry& run, const std::vector<std::string>& silent) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The formed generation's nodes all of whose ranks went silent (a heartbeat timeout), in the
  // order they went; empty when the timeout is too short to tell a lost node from a slow rank.
  std::vector<std::string> SilentNodes(const RunEntry& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // An elastic Slurm run whose generation failed on a heartbeat timeout that found its batch host
  // silent (among `silent`, as for ElasticNextNodes): the ranks of a few nodes that remain will be
  // told to requeue the job if the run restarts, or to cancel it if the run ended (`cancel`)
  // (Run.orphaned_job, saved with the run). The first kNodesThatMayActOnTheJob nodes, not all:
  // each rank claims the action with a create on the shared file system, where 12,000 nodes at
  // once would be a storm, and three leave spares enough for a node that dies.
  void HandTheJobToNodesThatRemainIfTheBatchHostIsLost(RunEntry& run, const std::vector<std::string>& silent,
                                                       bool cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  static constexpr int kNodesThatMayActOnTheJob = 3;
  void SetState(RunEntry& run, v1::RunState state, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Fails the current generation with `failure` as its root cause; waiting calls get
  // `waiter_status` (ABORTED naming the cause unless given). Then restarts or fails the run.
  // Appends a failure to the run's record (memory and SQLite) and makes it the run's reason.
  void RecordFailure(RunEntry& run, const v1::Failure& failure, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Stops the current generation's calls with `status`, saves its ranks, and records `failure`
  // (what ended it) as a run failure and the run's reason.
  void EndGeneration(RunEntry& run, const v1::Failure& failure, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Every rank left after the preemption checkpoint: the next generation waits for the requeued
  // job (REQUEUED), or the run fails once --max-requeues is spent.
  void RequeueGeneration(RunEntry& run, int signal, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  void FailGeneration(RunEntry& run, v1::Failure failure, Deferred& deferred,
                      std::optional<absl::Status> waiter_status = std::nullopt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Adds the nodes not yet in the run's excluded nodes (up to the limit); returns those added.
  std::vector<std::string> AddExcludedNodes(RunEntry& run, const std::vector<std::string>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Lists the ranks stopped by a signal before `failure` in it (victims, not causes).
  void AddStoppedRanks(const RunEntry& run, v1::Failure& failure) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);
  // Aborts the generation's store, barriers, rendezvous and open checkpoint round.
  void StopGeneration(RunEntry& run, const absl::Status& cause, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  v1::Run Snapshot(const RunEntry& run, bool with_ranks) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);
  void Notify(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  std::string DescribeRank(const RunEntry& run, int rank) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);

  // The generation a trainer call names, checked: ABORTED for an old one (naming why it ended),
  // FAILED_PRECONDITION for one not yet assigned or from the future, INVALID_ARGUMENT for a rank
  // out of range.
  enum class RankUse { kRequired, kToolAllowed };
  absl::StatusOr<Generation*> LiveGeneration(RunEntry& run, int64_t generation, int rank,
                                             RankUse use = RankUse::kRequired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);

  // The live, assigned generation in which `rank` is held by `incarnation`: LiveGeneration's
  // errors, FAILED_PRECONDITION before the rendezvous completed, ABORTED for a replaced process.
  absl::StatusOr<Generation*> AssignedRank(RunEntry& run, int64_t generation, int rank, const std::string& incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);

  // "rank 0 (node n1, host h1) at 12:00:01.234 UTC by SIGTERM, …" (at most 16).
  std::string DescribeStopped(const RunEntry& run, const std::vector<StoppedRank>& stopped) const
      ABSL_SHARED_LOCKS_REQUIRED(run.mu);

  // Whether rank `rank` of the current generation has not yet made a step: before the rendezvous
  // completed, at its start step, or (a program that reports no steps) within a minute of it.
  bool BeforeFirstStep(const RunEntry& run, int rank) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);

  // The newest committed checkpoint of the run, or the one it resumed from.
  std::optional<v1::CheckpointInfo> Latest(const RunEntry& run) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);

  void ScheduleHealthCheck();

  // ALREADY_EXISTS when an active run holds `dir` (same canonical path, or the same directory
  // under another spelling: device and inode).
  absl::Status CheckExperimentDirFree(const ExperimentDir& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_);
  void IndexExperimentDir(const v1::Run& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_);
  // SubmitRun's phases. AdmitSubmission either joins the active run of its join key or takes the
  // run's ranks and holds its join key (RESOURCE_EXHAUSTED, UNAVAILABLE); WithdrawSubmission gives
  // them back when a later phase refuses. ReserveSubmission reserves the directory and a run id
  // (ALREADY_EXISTS); MakeRunEntry prepares the directory and writes the record and run.json off
  // every lock (FAILED_PRECONDITION); the reservation is then released and the run published.
  struct Submission {
    std::optional<v1::SubmitRunResponse> joined;  // set: nothing was admitted
    int64_t ranks = 0;                            // admitted (RankAdmission) for the run
  };
  absl::StatusOr<Submission> AdmitSubmission(const v1::RunSpec& spec);
  void WithdrawSubmission(const v1::RunSpec& spec, int64_t ranks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_);
  std::optional<v1::SubmitRunResponse> JoinSubmittedRun(const std::string& join_key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_);
  absl::StatusOr<std::string> ReserveSubmission(const ExperimentDir& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_);
  void ReleaseSubmission(const v1::RunSpec& spec, const ExperimentDir& dir, const std::string& run_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_);
  absl::StatusOr<RunPtr> MakeRunEntry(const v1::RunSpec& spec, ExperimentDir& dir, const std::string& run_id,
                                      const std::string& token);

  CoordinatorStats* stats_ = nullptr;
  const CoordinatorOptions options_;
  const v1::TimeoutPolicy policy_;
  SharedBudget store_budget_;
  RankAdmission admission_;
  const Clock* const clock_;
  TimerQueue* const timers_;
  StateDb* const db_;

  mutable absl::Mutex registry_mu_;
  absl::flat_hash_map<std::string, RunPtr> runs_ ABSL_GUARDED_BY(registry_mu_);
  absl::flat_hash_map<std::string, std::string> token_to_run_ ABSL_GUARDED_BY(registry_mu_);
  absl::flat_hash_map<std::string, std::string> join_keys_ ABSL_GUARDED_BY(registry_mu_);
  std::multimap<std::string, std::string> exp_dir_runs_ ABSL_GUARDED_BY(registry_mu_);
  std::multimap<std::pair<uint64_t, uint64_t>, std::string> exp_dir_inodes_ ABSL_GUARDED_BY(registry_mu_);
  // Submissions between their reservation and their publication (SubmitRun's phases).
  std::set<std::string> submitting_dirs_ ABSL_GUARDED_BY(registry_mu_);
  std::set<std::pair<uint64_t, uint64_t>> submitting_inodes_ ABSL_GUARDED_BY(registry_mu_);
  std::set<std::string> submitting_join_keys_ ABSL_GUARDED_BY(registry_mu_);
  std::set<std::string> submitting_ids_ ABSL_GUARDED_BY(registry_mu_);
  bool shutting_down_ ABSL_GUARDED_BY(registry_mu_) = false;
  uint64_t next_watch_id_ ABSL_GUARDED_BY(registry_mu_) = 1;
  TimerQueue::Id health_timer_ ABSL_GUARDED_BY(registry_mu_) = 0;
  // Observers are a leaf lock: notified under run locks.
  mutable absl::Mutex observers_mu_;
  std::vector<RunObserver*> observers_list_ ABSL_GUARDED_BY(observers_mu_);
  std::vector<RunObserver*> Observers() const;
  // Accepted metric batches on their way to the state database and the observers
  // (metric_pipeline.h). Its passes run on the file work, which is destroyed first.
  std::unique_ptr<MetricPipeline> metrics_;
  std::unique_ptr<RunPersistence> persistence_;
  std::unique_ptr<RankRegistration> registration_;
  std::unique_ptr<StoreAndBarriers> store_barriers_;
  // Before the file work too: a capture's storage runs there.
  std::unique_ptr<StackCaptures> stacks_;
  std::unique_ptr<CheckpointLeadership> checkpoints_;  // a round's directory and publication too
  std::unique_ptr<HealthMonitor> health_;
  // File-system work (checkpoint verification and publication, removals, run.json, the periodic
  // progress flush; metric storage and delivery under keys of their own), off the run
  // locks, the RPC threads and the timer thread, in order per run. Declared after everything its
  // work uses (the managers above): destroyed before them, finishing posted work first.
  std::unique_ptr<FileWorkQueue> file_work_;
  // The health check's own thread: it takes every run's lock in turn and writes what it decides,
  // so it runs neither on the timer thread (whose timers it would delay) nor behind file work.
  std::unique_ptr<FileWorkQueue> health_work_;
};

}  // namespace dt
