// Stack captures: the evidence of a hang, taken on every node before the generation is stopped,
// and on-demand captures of a run that trains (dtctl stacks). The coordinator asks each rank
// through its heartbeat reply; whoever heartbeats for the rank captures it and answers with
// ReportStacks; the capture completes when every rank that captures answered or at its deadline.
// Completed captures go to the state database and, for a hang, to <exp dir>/hangs/gen-<G>/.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

// A stack capture waiting for the ranks' answers: at most one per generation (Generation::capture).
struct Coordinator::CaptureInProgress {
  v1::StackCapture capture;               // id, run, generation, requested_at, reason, live
  std::set<int> awaited;                  // ranks that capture stacks and have not answered
  std::map<int, v1::RankStacks> answers;  // by rank
  std::vector<int> left;                  // ranks that left (finished) before answering
  TimerQueue::Id deadline_timer = 0;
  std::optional<v1::Failure> hang;  // the generation fails with this once complete
  std::vector<PendingPtr<v1::StackCapture>> waiting;
};

class Coordinator::StackCaptures : private ManagerBase {
 public:
  explicit StackCaptures(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // ---- StacksService ----
  // One rank's answer to a capture (ReportStacks). INVALID_ARGUMENT (the request's fields),
  // NOT_FOUND (the run, or no such capture waiting), and AssignedRank's codes for the rank.
  absl::StatusOr<v1::ReportStacksResponse> Report(const v1::ReportStacksRequest& request);
  // Captures every rank's stacks of the running generation without stopping it (CaptureStacks);
  // `reply` gets the capture once every rank answered or the capture's deadline passed.
  // NOT_FOUND (run), FAILED_PRECONDITION (the run ended, is not training, or no rank captures).
  void Capture(const v1::CaptureStacksRequest& request, PendingPtr<v1::StackCapture> reply);
  // The captures kept for a run, newest first (GetStacks). INVALID_ARGUMENT, NOT_FOUND, and
  // INTERNAL when the state database cannot be read.
  absl::StatusOr<v1::GetStacksResponse> Get(const v1::GetStacksRequest& request);
  // How long a capture waits for the ranks: a heartbeat interval to ask, their capture's bound,
  // and the reply's way back.
  absl::Duration Window() const;
  // On-demand captures kept per run (hang captures are all kept).
  static constexpr int kLiveCapturesKept = 5;

  // ---- The run's other concerns, under its lock ----
  // Starts a capture of the running generation's ranks (or joins the one in progress): `hang`, when
  // set, is the failure the generation ends with once the capture completes (a hang's evidence is
  // taken before the group is stopped); `waiter` gets the capture. False when no rank captures
  // stacks (nothing started; the caller acts without the evidence).
  bool Begin(RunEntry& run, const std::string& reason, std::optional<v1::Failure> hang,
             PendingPtr<v1::StackCapture> waiter, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Completes the generation's capture in progress, if any, with what arrived: judges it, answers its waiters, stores
  // it (off the lock) and, for a hang whose generation still runs, fails the generation with the verdict.
  void Complete(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Rank `rank` left (its work done): the capture in progress no longer waits for it.
  void Excuse(RunEntry& run, int rank, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The coordinator is going away: whoever waits for the capture in progress hears `status`.
  void FailWaiting(RunEntry& run, const absl::Status& status, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);

 private:
  void OnDeadline(const std::string& run_id, const std::string& capture_id);
  // Keeps a completed capture on the run's file work: its database row, a hang's files, and then
  // drops it from the run's unsaved captures.
  void Keep(RunEntry& run, const v1::StackCapture& capture) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // A hang's generation fails with the capture's verdict, naming the odd rank when there is one.
  void FailWithEvidence(RunEntry& run, v1::Failure failure, const v1::StackCapture& capture, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
};

}  // namespace dt
