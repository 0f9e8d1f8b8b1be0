// Checkpoint rounds: leadership, a lease, verification and atomic commit. The ranks arrive at the
// generation's checkpoint barrier; the first released opens the round, whose partial directory is
// made on the run's file work; the writer (or, in a sharded round, every rank) commits a manifest;
// once every rank committed, the files are verified and published as step-S, `latest` moves and
// retention removes the oldest. Any rank's abort, death or lapsed lease aborts the round, and its
// partial directory is removed before any rank hears so.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/checkpoint_shards.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class DirFd;

struct Coordinator::CheckpointRound {
  enum class State { kOpen, kVerifying, kCommitted, kAborted };
  std::string id;
  int64_t generation = 0;
  uint64_t sequence = 0;  // the arrival barrier instance that opened it
  int64_t step = 0;
  int writer = 0;  // -1 in a sharded round
  std::string writer_desc;
  bool sharded = false;  // every rank writes its own files
  int world = 0;         // ranks of the generation
  // checkpoints/ held open for the round: every file operation is relative to it, so a link or
  // a rename planted meanwhile cannot redirect the commit, the clean-up or the retention. Set once
  // the file work has made the round's partial directory; until then the ranks' Begin replies
  // wait in `begin_waiting`.
  std::shared_ptr<const DirFd> checkpoints;
  std::string partial_name;
  std::string partial_dir;  // paths as the writer is told them
  std::string final_dir;
  State state = State::kOpen;
  std::vector<PendingPtr<v1::BeginCheckpointResponse>> begin_waiting;
  TimerQueue::Id lease_timer = 0;
  absl::Time opened;
  std::map<int, PendingPtr<v1::CommitCheckpointResponse>> waiting;  // rank → commit reply
  // The writer's manifest, kept until every rank has committed: a rank's exception in its block
  // (AbortCheckpoint) aborts the round until then.
  std::optional<v1::Manifest> manifest;
  std::string layout_json;  // the single writer's layout document, if it sent one
  ShardCollector shards;    // sharded rounds: each committed rank's manifest and the layout
  absl::Status outcome;     // when aborted
  v1::CheckpointInfo info;  // when committed
};

class Coordinator::CheckpointLeadership : private ManagerBase {
 public:
  explicit CheckpointLeadership(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // ---- CheckpointService (codes as checkpoint.proto lists them) ----
  // A rank arrives at the round for `request.step()`; `reply` gets the round once every rank
  // arrived and its partial directory exists.
  void Begin(const v1::BeginCheckpointRequest& request, PendingPtr<v1::BeginCheckpointResponse> reply);
  // A rank's commit (the writer's manifest, or its own shard's); `reply` gets the published
  // checkpoint once every rank committed, or the round's abort.
  void Commit(const v1::CommitCheckpointRequest& request, PendingPtr<v1::CommitCheckpointResponse> reply);
  // A rank's exception in its block aborts the round. The reply comes behind the removal of the
  // round's directory, whether this call ended the round or another had: a rank told of the abort
  // finds nothing of it left.
  void Abort(const v1::AbortCheckpointRequest& request, PendingPtr<v1::AbortCheckpointResponse> reply);
  // NOT_FOUND for a run without a committed checkpoint (or no such run).
  absl::StatusOr<v1::CheckpointInfo> Latest(const std::string& run_id);
  // The run's checkpoints, oldest first: the one it resumed from while it is on disk, then its own.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> List(const std::string& run_id);

  // ---- The run's other concerns, under its lock ----
  // The generation stopped: its open round, if any, aborts with `cause`.
  void AbortOpenRound(RunEntry& run, const absl::Status& cause, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The coordinator is going away: the ranks waiting in an open round hear `status`.
  void FailWaiting(RunEntry& run, const absl::Status& status, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);

 private:
  // Called as each rank is released from the arrival barrier; the first opens the round. A rank
  // released with ranks that asked for another step or kind aborts it (FAILED_PRECONDITION).
  void OpenRound(const RunPtr& run, int64_t generation, int rank, int64_t step, bool sharded, uint64_t sequence,
                 const PendingPtr<v1::BeginCheckpointResponse>& reply);
  // A rank's commit in a sharded round: its manifest joins the round (or, refused, aborts it), and
  // the round is published once every rank's is in.
  void CommitShard(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round,
                   const v1::CommitCheckpointRequest& request, const PendingPtr<v1::CommitCheckpointResponse>& reply,
                   Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  // Holds a rank's commit until its round is published or aborted (a retry of the rank replaces it,
  // the earlier call hears CANCELLED) and publishes once every rank is in and the files are known.
  void AwaitPublication(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round, int rank,
                        const PendingPtr<v1::CommitCheckpointResponse>& reply, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  // A single-writer round's commit from `request.rank()`: the writer's manifest and layout are
  // taken; INVALID_ARGUMENT for a bad one, or for a manifest or layout from another rank.
  absl::Status TakeSingleWriterCommit(CheckpointRound& round, const v1::CommitCheckpointRequest& request);
  // A refused commit aborts its open round (the other ranks would wait out the lease); the rank
  // hears `cause` once the round's directory is gone.
  void RefuseCommit(const RunPtr& run, CheckpointRound& round, const absl::Status& cause,
                    const PendingPtr<v1::CommitCheckpointResponse>& reply, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  // Ends an open round (or one whose publication failed) and removes its partial directory on
  // the run's file work. Only the round's own publication task may abort a round being verified:
  // that removal does not wait for the publication sequence (PublicationWorkKey).
  void AbortRound(RunEntry& run, CheckpointRound& round, const absl::Status& cause, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Answers `reply` on the run's file work, behind an aborted round's removal of its partial
  // directory (queued there first): a rank told "aborted" finds nothing of the round left.
  template <typename T>
  void ReplyBehindRemoval(const std::string& run_id, const PendingPtr<T>& reply,
                          typename std::common_type<absl::StatusOr<T>>::type result);
  // Answers a rank's Begin for `round`: the round, its abort, or later, once its directory exists.
  void ReplyToBegin(const std::string& run_id, CheckpointRound& round,
                    const PendingPtr<v1::BeginCheckpointResponse>& reply, Deferred& deferred);
  // The file work made (or failed to make) `round`'s partial directory: the round opens or aborts.
  void PartialDirMade(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round,
                      std::shared_ptr<const DirFd> checkpoints, const absl::Status& made);
  // Every rank committed and the files are known: verify and publish on the file work, under
  // PublicationWorkKey (the publication and its retention pass, in order, beside the run's other
  // file work: the next round's partial directory is not made behind a retention pass).
  void StartPublish(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  void FinishPublish(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round,
                     absl::StatusOr<v1::CheckpointInfo> result);
  void OnLeaseExpired(const std::string& run_id, const std::string& round_id);
  // Forgets all but the newest keep_checkpoints committed checkpoints and returns the steps
  // whose directories stay (the caller removes the others, outside the lock).
  std::vector<int64_t> Retire(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
};

}  // namespace dt
