// Health and failures as the ranks report them: heartbeats (per rank and per node), reported
// errors, stops by a signal, device pre-flights, ranks leaving, and the watchdog that turns
// silence and hangs into failures. What a failure then does to the run (the generation ended,
// a restart or the end) is the run lifecycle's, on Coordinator (FailGeneration).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class Coordinator::HealthMonitor : private ManagerBase {
 public:
  explicit HealthMonitor(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // ---- RendezvousService ----
  // Each answers INVALID_ARGUMENT (the request's fields), NOT_FOUND (the run) and the codes below.
  // One rank's heartbeat: STOP (with the reason) for an ended generation or run; ABORTED for a
  // replaced process; FAILED_PRECONDITION before the rendezvous completed or for a generation
  // that does not exist.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // Several ranks' heartbeats under one lock; each rank's answer or status (Heartbeat's codes) in
  // the order asked. The call itself: INVALID_ARGUMENT, NOT_FOUND.
  absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(const v1::NodeHeartbeatRequest& request);
  // A rank's (or a node slot's, or a scheduler task's) error fails the generation with it as the
  // root cause. ABORTED (an ended generation, a stale incarnation), FAILED_PRECONDITION (a
  // generation that does not exist, a task that holds no rank); an ended run answers OK.
  absl::StatusOr<v1::ReportErrorResponse> ReportError(const v1::ReportErrorRequest& request);
  // A rank stopped by a signal from outside: a victim until the watchdog finds nothing else failed.
  // OK, changing nothing, for an ended run or generation; ABORTED (a replaced process),
  // FAILED_PRECONDITION (before the rendezvous completed, a generation that does not exist).
  absl::StatusOr<v1::ReportStoppedResponse> ReportStopped(const v1::ReportStoppedRequest& request);
  // Records a rank's device pre-flight; an unhealthy device (an error, or far slower than the
  // group's median on runs whose nodes can be left out) fails the generation NODE_UNHEALTHY and,
  // on Slurm, excludes the node. FAILED_PRECONDITION (the run ended, the rendezvous not complete, a
  // generation that does not exist), ABORTED (an ended generation, a replaced process).
  absl::StatusOr<v1::ReportPreflightResponse> ReportPreflight(const v1::ReportPreflightRequest& request);
  // A rank finished; the last to leave ends the run SUCCEEDED (or REQUEUED after a preemption).
  // OK for a retry after the run succeeded; ABORTED (an ended generation or run, a replaced
  // process), FAILED_PRECONDITION (before the rendezvous completed, a generation that does not exist).
  absl::StatusOr<v1::LeaveResponse> Leave(const v1::LeaveRequest& request);

  // Runs the heartbeat and hang checks once over every run (the coordinator's health thread does
  // this every health_check_period): a verdict fails the generation, a hang after its stacks are
  // captured; dirty progress is flushed.
  void CheckHealth();

 private:
  // One rank's heartbeat (Heartbeat's logic) under the run's lock.
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatLocked(RunEntry& run, int64_t generation,
                                                        const v1::RankHeartbeat& beat, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The STOP of an ended generation's rank: each of run.orphaned_job's ranks is told to requeue
  // the job (a run that restarts) or cancel it (a run that ended), in every STOP it gets; no other
  // rank is. The ranks claim the action among themselves (client/slurm_job.h).
  void HandOutTheOrphanedJob(RunEntry& run, int64_t generation, int rank, v1::HeartbeatResponse& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The rank a ReportError names by rank, by node and slot, or by scheduler task: -1 when the
  // generation has no ranks yet or (node and slot) none matches; FAILED_PRECONDITION for a task
  // that holds no rank.
  absl::StatusOr<int> ReportedRank(RunEntry& run, const v1::ReportErrorRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Fails the generation NODE_UNHEALTHY, naming the worst rank; on Slurm and external runs the
  // nodes of `bad` join the run's excluded nodes.
  void FailUnhealthy(RunEntry& run, const std::vector<UnhealthyRank>& bad, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The health verdict of a running generation as the failure it causes.
  v1::Failure VerdictFailure(const RunEntry& run, const HealthVerdict& verdict) const
      ABSL_SHARED_LOCKS_REQUIRED(run.mu);
};

}  // namespace dt
