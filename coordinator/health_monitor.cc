// Health and failures (health_monitor.h): the ranks' reports under the run's lock, and the
// watchdog's pass over every run.
#include "coordinator/health_monitor.h"

#include <signal.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "common/utf8.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/hang_verdict.h"
#include "coordinator/request_checks.h"
#include "coordinator/run_persistence.h"
#include "coordinator/stack_captures.h"

namespace dt {

absl::Duration IdleTimeout(const v1::RunSpec& spec) {
  if (spec.exec_command().empty()) return absl::ZeroDuration();  // dttrainer: the step watchdog
  return spec.has_idle_timeout_ms() ? absl::Milliseconds(spec.idle_timeout_ms()) : kDefaultIdleTimeout;
}

namespace {

std::string Truncate(const std::string& text) {
  if (text.size() <= kMaxMessageBytes) return text;
  return absl::StrCat(TruncateUtf8(text, kMaxMessageBytes), "…(truncated from ", text.size(), " bytes)");
}

}  // namespace

absl::StatusOr<v1::HeartbeatResponse> Coordinator::HealthMonitor::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::RankHeartbeat beat;
  beat.set_rank(request.rank());
  beat.set_incarnation(request.incarnation());
  beat.set_step(request.step());
  beat.set_total_steps(request.total_steps());
  beat.set_worker_pid(request.worker_pid());
  beat.set_idle_ms(request.idle_ms());
  if (absl::Status s = ValidateRankHeartbeat(beat); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  return HeartbeatLocked(*run, request.generation(), beat, coordinator_.clock_->Now());
}

absl::StatusOr<v1::NodeHeartbeatResponse> Coordinator::HealthMonitor::NodeHeartbeat(
    const v1::NodeHeartbeatRequest& request) {
  if (absl::Status s = ValidateNodeHeartbeatRequest(request); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  v1::NodeHeartbeatResponse out;
  absl::Time now = coordinator_.clock_->Now();
  for (const v1::RankHeartbeat& beat : request.ranks()) {
    v1::NodeHeartbeatResponse::RankAnswer& answer = *out.add_ranks();
    answer.set_rank(beat.rank());
    absl::StatusOr<v1::HeartbeatResponse> reply = HeartbeatLocked(*run, request.generation(), beat, now);
    if (reply.ok()) {
      *answer.mutable_reply() = std::move(*reply);
    } else {
      answer.set_code(static_cast<int>(reply.status().code()));
      answer.set_message(std::string(reply.status().message()));
    }
  }
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::HealthMonitor::HeartbeatLocked(RunEntry& run, int64_t generation,
                                                                                  const v1::RankHeartbeat& beat,
                                                                                  absl::Time now) {
  v1::Run& r = run.stored.run;
  Generation& g = *run.gen;
  v1::HeartbeatResponse out;
  out.set_run_state(r.state());
  out.set_current_generation(g.number);
  if (generation < g.number || IsTerminal(r.state())) {
    absl::StatusOr<Generation*> live = coordinator_.LiveGeneration(run, generation, beat.rank());
    out.set_directive(v1::HeartbeatResponse::STOP);
    out.set_reason(std::string(live.status().message()));
    HandOutTheOrphanedJob(run, generation, beat.rank(), out);
    return out;
  }
  absl::StatusOr<Generation*> live = coordinator_.LiveGeneration(run, generation, beat.rank());
  if (!live.ok()) return live.status();
  if (!g.assigned) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", g.number, " of run ", r.run_id(), " has not completed rendezvous"));
  }
  v1::RankStatus& rank = g.ranks[beat.rank()];
  if (rank.incarnation() != beat.incarnation()) {
    return absl::AbortedError(absl::StrCat("rank ", beat.rank(), " of generation ", g.number,
                                           " belongs to incarnation ", rank.incarnation(), " (pid ", rank.pid(), " on ",
                                           rank.host(), "); this process was replaced and must exit"));
  }
  g.health->Heartbeat(beat.rank(), beat.step(), now);
  g.health->SetIdle(beat.rank(), absl::Milliseconds(beat.idle_ms()), now);
  if (beat.total_steps() > 0) r.set_total_steps(beat.total_steps());
  if (beat.worker_pid() > 0) rank.set_pid(beat.worker_pid());
  rank.set_idle_ms(beat.idle_ms());
  g.ranks_dirty = true;
  out.set_directive(v1::HeartbeatResponse::CONTINUE);
  // A capture waits for this rank's stacks: asked in every reply until they arrive.
  if (g.capture && g.capture->awaited.count(beat.rank()) > 0) out.set_capture_id(g.capture->capture.capture_id());
  return out;
}

void Coordinator::HealthMonitor::HandOutTheOrphanedJob(RunEntry& run, int64_t generation, int rank,
                                                       v1::HeartbeatResponse& out) {
  const v1::Run& r = run.stored.run;
  if (!r.has_orphaned_job()) return;
  const v1::OrphanedJob& job = r.orphaned_job();
  // A requeue is never handed to a run that ended, one a user cancelled after the decision
  // included (`dtctl cancel` cancels the job itself): SetState clears it then.
  if (job.generation() != generation || !absl::c_linear_search(job.ranks(), rank)) return;
  if (job.cancel()) {
    out.set_cancel_job(job.job());
  } else {
    out.set_requeue_job(job.job());
  }
}

absl::StatusOr<v1::ReportErrorResponse> Coordinator::HealthMonitor::ReportError(const v1::ReportErrorRequest& request) {
  if (absl::Status s = ValidateReportErrorRequest(request); !s.ok()) return s;
  const bool by_task = request.has_scheduler_task();
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  v1::ReportErrorResponse out;
  if (IsTerminal(r.state())) {
    out.set_run_state(r.state());
    out.set_current_generation(r.generation());
    return out;  // nothing left to fail
  }
  Generation& g = *run->gen;
  if (request.generation() < g.number) {
    return coordinator_.LiveGeneration(*run, request.generation(), 0).status();
  }
  if (request.generation() > g.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", request.generation(), " of run ", r.run_id(), " does not exist"));
  }
  int world = g.rendezvous.world_size();
  if (request.rank() >= world || (by_task && request.scheduler_task() >= world)) {
    return absl::InvalidArgumentError(absl::StrCat(by_task ? "scheduler task " : "rank ",
                                                   by_task ? request.scheduler_task() : request.rank(),
                                                   " is outside 0..", world - 1, " of run ", r.run_id()));
  }
  v1::Failure failure;
  failure.set_kind(request.process_exited() ? v1::Failure::PROCESS_EXITED : v1::Failure::REPORTED_ERROR);
  failure.set_rank(request.rank());
  failure.set_node(request.node());
  failure.set_host(request.host());
  failure.set_step(request.step());
  failure.set_message(Truncate(request.message()));
  failure.set_exception_type(Truncate(request.exception_type()));
  failure.set_stack(Truncate(request.stack()));
  failure.set_fatal(request.fatal());
  absl::StatusOr<int> rank = ReportedRank(*run, request);
  if (!rank.ok()) return rank.status();
  if (*rank >= 0) {
    const v1::RankStatus& rs = g.ranks[*rank];
    if (!request.incarnation().empty() && request.incarnation() != rs.incarnation()) {
      return absl::AbortedError(absl::StrCat("rank ", *rank, " of generation ", g.number,
                                             " belongs to another incarnation; this report is stale"));
    }
    failure.set_rank(*rank);
    failure.set_node(rs.node());
    if (failure.host().empty()) failure.set_host(rs.host());
    if (failure.step() == 0 && g.health) failure.set_step(g.health->step(*rank));
  } else if (by_task) {
    // The task never held a rank: it died before the rendezvous completed.
    for (const Registrant& reg : g.rendezvous.registrants()) {
      if (reg.scheduler_task == request.scheduler_task()) {
        failure.set_node(reg.node);
        failure.set_host(reg.host);
      }
    }
  }
  coordinator_.FailGeneration(*run, failure, deferred);
  out.set_run_state(r.state());
  out.set_current_generation(run->gen->number);
  return out;
}

absl::StatusOr<int> Coordinator::HealthMonitor::ReportedRank(RunEntry& run, const v1::ReportErrorRequest& request) {
  const Generation& g = *run.gen;
  if (!g.assigned) return -1;
  if (request.rank() >= 0) return request.rank();
  for (const auto& rs : g.ranks) {
    if (request.has_scheduler_task() ? rs.has_scheduler_task() && rs.scheduler_task() == request.scheduler_task()
                                     : rs.node() == request.node() && rs.local_rank() == request.local_slot()) {
      return rs.rank();
    }
  }
  if (request.has_scheduler_task()) {
    return absl::FailedPreconditionError(
        absl::StrCat("scheduler task ", request.scheduler_task(), " holds no rank of generation ", g.number, " of run ",
                     run.stored.run.run_id(), " (its ranks registered without that task id)"));
  }
  return -1;
}

absl::StatusOr<v1::ReportStoppedResponse> Coordinator::HealthMonitor::ReportStopped(
    const v1::ReportStoppedRequest& request) {
  if (absl::Status s = ValidateReportStoppedRequest(request); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  v1::ReportStoppedResponse out;
  out.set_run_state(r.state());
  out.set_current_generation(run->gen->number);
  // A victim of a generation that already ended (the launcher stops the others afterwards).
  if (IsTerminal(r.state()) || request.generation() < run->gen->number) return out;
  absl::StatusOr<Generation*> live =
      coordinator_.AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
  if (!live.ok()) return live.status();
  Generation& g = **live;
  v1::RankStatus& rank = g.ranks[request.rank()];
  if (rank.state() == v1::RankStatus::ACTIVE) {
    g.health->Heartbeat(request.rank(), request.step(), coordinator_.clock_->Now());
    g.health->Stop(request.rank(), request.signal(), coordinator_.clock_->Now());
    rank.set_state(v1::RankStatus::STOPPED);
    g.ranks_dirty = g.rows_dirty = true;
    DT_LOG(Info) << "run " << r.run_id() << " generation " << g.number << ": "
                 << coordinator_.DescribeRank(*run, request.rank()) << " was stopped by "
                 << SignalName(request.signal()) << " at step " << request.step();
    coordinator_.Notify(*run, deferred);
  }
  return out;
}

absl::StatusOr<v1::ReportPreflightResponse> Coordinator::HealthMonitor::ReportPreflight(
    const v1::ReportPreflightRequest& request) {
  if (absl::Status s = ValidateReportPreflightRequest(request); !s.ok()) return s;
  const v1::DevicePreflight& result = request.result();
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  if (IsTerminal(r.state())) return RunEndedError(r);
  absl::StatusOr<Generation*> live =
      coordinator_.AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
  if (!live.ok()) return live.status();
  Generation& g = **live;
  v1::RankStatus& rank = g.ranks[request.rank()];
  if (!rank.has_preflight()) {  // the first report counts; a retry changes nothing
    v1::DevicePreflight* kept = rank.mutable_preflight();
    *kept = result;
    kept->set_device(Truncate(result.device()));
    kept->set_error(Truncate(result.error()));
    ++g.preflights_reported;
    g.ranks_dirty = g.rows_dirty = true;
    bool complete = g.preflights_reported == static_cast<int>(g.ranks.size());
    if (complete || !kept->error().empty()) {
      std::vector<std::optional<v1::DevicePreflight>> reports(g.ranks.size());
      for (const v1::RankStatus& rs : g.ranks) {
        if (rs.has_preflight()) reports[rs.rank()] = rs.preflight();
      }
      bool judge_speed = r.spec().scheduler() == v1::SLURM || r.spec().scheduler() == v1::EXTERNAL;
      std::vector<UnhealthyRank> bad = JudgePreflights(reports, coordinator_.options_.preflight, judge_speed);
      if (!bad.empty()) FailUnhealthy(*run, bad, deferred);
    }
  }
  v1::ReportPreflightResponse out;
  out.set_run_state(r.state());
  out.set_current_generation(run->gen->number);
  // (`g` may be gone: a failed generation is replaced by the next.)
  if (r.has_reason() && r.reason().kind() == v1::Failure::NODE_UNHEALTHY &&
      r.reason().generation() == request.generation()) {
    out.set_unhealthy(DescribeFailure(r.reason()));
  }
  return out;
}

void Coordinator::HealthMonitor::FailUnhealthy(RunEntry& run, const std::vector<UnhealthyRank>& bad,
                                               Deferred& deferred) {
  const Generation& g = *run.gen;
  const v1::Run& r = run.stored.run;
  const v1::RankStatus& worst = g.ranks[bad.front().rank];
  v1::Failure failure;
  failure.set_kind(v1::Failure::NODE_UNHEALTHY);
  failure.set_rank(worst.rank());
  failure.set_node(worst.node());
  failure.set_host(worst.host());
  failure.set_step(g.health ? g.health->step(worst.rank()) : 0);
  std::string message = absl::StrCat("failed the device pre-flight: ", bad.front().why);
  std::vector<std::string> nodes;
  for (size_t k = 0; k < bad.size(); ++k) {
    const std::string& node = g.ranks[bad[k].rank].node();
    if (!absl::c_linear_search(nodes, node)) nodes.push_back(node);
    if (k > 0 && k <= 16)
      absl::StrAppend(&message, k == 1 ? "; also " : ", ", coordinator_.DescribeRank(run, bad[k].rank), ": ",
                      bad[k].why);
  }
  if (r.spec().scheduler() == v1::SLURM || r.spec().scheduler() == v1::EXTERNAL) {
    std::vector<std::string> added = coordinator_.AddExcludedNodes(run, nodes);
    if (!added.empty()) {
      absl::StrAppend(&message, "; node", added.size() > 1 ? "s " : " ", absl::StrJoin(added, ", "),
                      " excluded from the job, which runs again without ", added.size() > 1 ? "them" : "it");
    }
  }
  failure.set_message(message);
  coordinator_.FailGeneration(run, failure, deferred);
}

absl::StatusOr<v1::LeaveResponse> Coordinator::HealthMonitor::Leave(const v1::LeaveRequest& request) {
  if (absl::Status s = ValidateLeaveRequest(request); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  v1::LeaveResponse out;
  if (r.state() == v1::SUCCEEDED && request.generation() == run->gen->number) {
    out.set_run_state(r.state());
    return out;  // a retry after the last rank left
  }
  absl::StatusOr<Generation*> live =
      coordinator_.AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
  if (!live.ok()) return live.status();
  Generation& g = **live;
  v1::RankStatus& rank = g.ranks[request.rank()];
  if (rank.state() != v1::RankStatus::FINISHED) {
    g.health->Heartbeat(request.rank(), request.final_step(), coordinator_.clock_->Now());
    g.health->Finish(request.rank(), coordinator_.clock_->Now());
    rank.set_state(v1::RankStatus::FINISHED);
    g.ranks_dirty = g.rows_dirty = true;
    if (request.preempted()) g.preempted_by = request.signal() > 0 ? request.signal() : SIGUSR2;
    g.time_limit = g.time_limit || (request.preempted() && request.time_limit());
    coordinator_.stacks_->Excuse(*run, request.rank(), deferred);  // a rank that left has no stacks to give
  }
  if (g.health->all_finished()) {
    int64_t final_step = 0;
    for (const auto& rs : g.ranks) final_step = std::max(final_step, g.health->step(rs.rank()));
    r.set_step(final_step);
    if (g.preempted_by != 0) {
      coordinator_.RequeueGeneration(*run, g.preempted_by, deferred);
    } else {
      coordinator_.persistence_->PersistRanks(*run, deferred);
      coordinator_.StopGeneration(*run, absl::AbortedError(absl::StrCat("run ", r.run_id(), " has succeeded")),
                                  deferred);
      coordinator_.SetState(*run, v1::SUCCEEDED, deferred);
    }
  }
  out.set_run_state(r.state());
  return out;
}

v1::Failure Coordinator::HealthMonitor::VerdictFailure(const RunEntry& run, const HealthVerdict& verdict) const {
  const Generation& g = *run.gen;
  v1::Failure failure;
  failure.set_rank(verdict.rank);
  failure.set_step(verdict.step);
  if (verdict.rank >= 0) {
    failure.set_node(g.ranks[verdict.rank].node());
    failure.set_host(g.ranks[verdict.rank].host());
  }
  std::string since = absl::FormatTime("%H:%M:%E3S", verdict.since, absl::UTCTimeZone());
  switch (verdict.kind) {
    case HealthVerdict::Kind::kHeartbeatTimeout: {
      failure.set_kind(v1::Failure::HEARTBEAT_TIMEOUT);
      *failure.mutable_last_heard() = ToProtoTime(verdict.since);
      std::string others;
      for (size_t k = 0; k < verdict.also_silent.size() && k < 16; ++k) {
        auto [rank, last] = verdict.also_silent[k];
        absl::StrAppend(&others, k == 0 ? "; also silent: " : ", ", coordinator_.DescribeRank(run, rank), " since ",
                        absl::FormatTime("%H:%M:%E3S", last, absl::UTCTimeZone()));
      }
      failure.set_message(absl::StrCat("sent no heartbeat for ", absl::FormatDuration(verdict.timeout), " (last at ",
                                       since, " UTC, at step ", verdict.step,
                                       "): the process died or its node is unreachable", others));
      break;
    }
    case HealthVerdict::Kind::kStopped:
      failure.set_kind(v1::Failure::TERMINATED);
      failure.set_message(
          verdict.rank < 0 ? absl::StrCat("every rank was stopped by a signal from outside and none failed first (",
                                          coordinator_.DescribeStopped(run, verdict.stopped),
                                          "): the job was cancelled outside dt, preempted or reached its time limit")
                           : absl::StrCat("was stopped by ", SignalName(verdict.stopped.front().signal), " at ", since,
                                          " UTC while the other ranks kept running, and nothing else failed within ",
                                          absl::FormatDuration(verdict.timeout), ": something outside dt killed it"));
      break;
    case HealthVerdict::Kind::kIdle: {
      failure.set_kind(v1::Failure::HANG);
      std::vector<int> idle = verdict.idle_ranks;
      failure.set_message(absl::StrCat(idle.size() == 1 ? "rank " : "ranks ", RankList(idle),
                                       ": no output, no CPU (under 1% of a core) and no step for ",
                                       absl::FormatDuration(verdict.timeout), " (idle since ", since,
                                       " UTC; --idle-timeout): a hang"));
      break;
    }
    case HealthVerdict::Kind::kHang: {
      failure.set_kind(v1::Failure::HANG);
      std::vector<std::string> stuck;
      for (int rank : verdict.stuck_ranks) {
        if (stuck.size() == 16) {
          stuck.push_back("…");
          break;
        }
        stuck.push_back(absl::StrCat(rank));
      }
      failure.set_rank(-1);
      failure.set_message(absl::StrCat("no rank advanced past step ", verdict.step, " for ",
                                       absl::FormatDuration(verdict.timeout), " (last progress at ", since,
                                       " UTC) although every rank heartbeats: a hang, e.g. in a "
                                       "collective; ranks at step ",
                                       verdict.step, ": ", absl::StrJoin(stuck, ", ")));
      break;
    }
  }
  return failure;
}

void Coordinator::HealthMonitor::CheckHealth() {
  absl::Time now = coordinator_.clock_->Now();
  for (const RunPtr& run : coordinator_.AllRuns()) {
    LockedRun locked(*run);
    Deferred& deferred = locked.deferred();
    if (IsTerminal(run->stored.run.state()) || !run->gen) continue;
    Generation& g = *run->gen;
    if (!g.assigned || !g.stopped.ok()) continue;
    // A hang's capture is under way: its completion fails the generation with the evidence.
    if (g.capture && g.capture->hang) continue;
    HealthTimeouts limits{coordinator_.options_.timeouts.heartbeat_timeout, coordinator_.options_.timeouts.hang_timeout,
                          coordinator_.options_.timeouts.rendezvous_timeout, IdleTimeout(run->stored.run.spec())};
    if (std::optional<HealthVerdict> verdict = g.health->Check(now, limits)) {
      v1::Failure failure = VerdictFailure(*run, *verdict);
      bool hang = verdict->kind == HealthVerdict::Kind::kHang || verdict->kind == HealthVerdict::Kind::kIdle;
      // Evidence before the kill: every rank's stacks, captured while every process still lives.
      if (!hang || !coordinator_.stacks_->Begin(*run, failure.message(), failure, nullptr, deferred)) {
        coordinator_.FailGeneration(*run, failure, deferred);
      }
      continue;
    }
    if (g.ranks_dirty && now - g.last_flush >= absl::Seconds(2)) coordinator_.persistence_->FlushProgress(run);
  }
}

}  // namespace dt
