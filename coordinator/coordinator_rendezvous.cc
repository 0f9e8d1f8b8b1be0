// Rendezvous and health: registration, heartbeats, reported errors, leaving, the watchdog.
#include <algorithm>
#include <cmath>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/duration.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "common/stop_signals.h"
#include "common/utf8.h"
#include "coordinator/coordinator.h"

#include <signal.h>
#include "coordinator/coordinator_internal.h"
#include "coordinator/hang_verdict.h"
#include "coordinator/request_checks.h"

namespace dt {
namespace {

std::string Truncate(const std::string& text) {
  if (text.size() <= kMaxMessageBytes) return text;
  return absl::StrCat(TruncateUtf8(text, kMaxMessageBytes), "…(truncated from ", text.size(), " bytes)");
}

}  // namespace

v1::RegisterResponse Coordinator::MakeRegisterResponse(const RunEntry& run, const Seat& seat) const {
  const v1::Run& r = run.stored.run;
  v1::RegisterResponse out;
  out.set_run_id(r.run_id());
  out.set_rank(seat.assignment.rank);
  out.set_world_size(WorldSize(r.spec()));
  out.set_local_rank(seat.assignment.local_rank);
  out.set_local_world_size(seat.assignment.local_world_size);
  out.set_node_rank(seat.assignment.node_rank);
  out.set_nodes(seat.assignment.nodes);
  out.set_generation(r.generation());
  out.set_exp_dir(r.exp_dir());
  if (std::optional<v1::CheckpointInfo> latest = Latest(run)) *out.mutable_resume() = *latest;
  *out.mutable_spec() = r.spec();
  *out.mutable_timeouts() = policy_;
  out.set_restarts(r.restarts());
  return out;
}

absl::Status Coordinator::CheckRunAcceptsRegistration(const RunEntry& run, const v1::RegisterRequest& request) const {
  const v1::Run& r = run.stored.run;
  if (IsTerminal(r.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", r.run_id(), " has ended ", StateName(r.state()),
                     r.has_reason() ? absl::StrCat(" (", DescribeFailure(r.reason()), ")") : "",
                     "; submit a new run to train again"));
  }
  const v1::RunSpec& spec = r.spec();
  const v1::WorldView& view = request.expected();
  int world = WorldSize(spec);
  if ((view.world_size() != 0 && view.world_size() != world) || (view.nodes() != 0 && view.nodes() != spec.nodes()) ||
      (view.procs_per_node() != 0 && view.procs_per_node() != spec.procs_per_node())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the trainer on ", request.host(), " expects world size ", view.world_size(), " (", view.nodes(),
                     " nodes x ", view.procs_per_node(), " per node) but run ", r.run_id(), " has world size ", world,
                     " (", spec.nodes(), " nodes x ", spec.procs_per_node(),
                     " per node); start the trainers with the run's shape instead of forming a smaller world"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CountProcsPerNode(RunEntry& run, const v1::RegisterRequest& request, Deferred& deferred) {
  v1::Run& r = run.stored.run;
  v1::RunSpec& spec = *r.mutable_spec();
  if (spec.procs_per_node_rule().empty() || IsTerminal(r.state())) return absl::OkStatus();
  const std::string rule = absl::StrCat("--nproc-per-node ", spec.procs_per_node_rule());
  int counted = request.expected().procs_per_node();
  if (counted <= 0) {
    if (spec.procs_per_node() > 0) return absl::OkStatus();  // the submitter resolved it; the run's count holds
    return absl::FailedPreconditionError(absl::StrCat(
        "run ", r.run_id(), " counts its processes per node on each node (", rule, "), but the process on ",
        request.host(), " did not say its node's count: start the run's nodes with dtrun"));
  }
  int64_t world = static_cast<int64_t>(spec.nodes()) * counted;
  std::string wrong;
  if (spec.procs_per_node() > 0 && counted != spec.procs_per_node()) {
    wrong = absl::StrCat("node ", Quote(request.node()), " counted ", counted, " processes (", rule, ") but ",
                         r.procs_per_node_counted_on().empty()
                             ? "the submitter counted"
                             : absl::StrCat("node ", Quote(r.procs_per_node_counted_on()), " counted"),
                         " ", spec.procs_per_node(),
                         "; every node of a run starts the same number: run on alike nodes, or give "
                         "--nproc-per-node a count");
  } else if (world > kMaxWorldSize) {
    wrong = absl::StrCat("node ", Quote(request.node()), " counted ", counted, " processes (", rule,
                         "): ", spec.nodes(), " nodes x ", counted, " = ", world, " ranks exceed the limit of ",
                         kMaxWorldSize, "; give --nproc-per-node a count");
  }
  absl::Status admitted = absl::OkStatus();
  if (wrong.empty() && spec.procs_per_node() == 0) {
    admitted = admission_.Admit(world - run.ranks_admitted,
                                absl::StrCat("run ", r.run_id(), " (", spec.nodes(), " nodes x ", counted, " = ", world,
                                             " ranks, ", run.ranks_admitted, " of them held already)"));
    if (admitted.ok()) {
      run.ranks_admitted = world;
    } else {
      wrong = absl::StrCat("node ", Quote(request.node()), " counted ", counted, " processes (", rule,
                           "): ", admitted.message(), "; then submit the run again");
    }
  }
  if (!wrong.empty()) {
    v1::Failure failure;
    failure.set_kind(v1::Failure::MISCONFIGURED);
    failure.set_rank(-1);
    failure.set_node(request.node());
    failure.set_host(request.host());
    failure.set_message(wrong);
    failure.set_fatal(true);
    FailGeneration(run, failure, deferred);
    std::string ended = absl::StrCat("run ", r.run_id(), " ended: ", wrong);
    return admitted.ok() ? absl::FailedPreconditionError(ended) : absl::ResourceExhaustedError(ended);
  }
  if (spec.procs_per_node() > 0) return absl::OkStatus();
  spec.set_procs_per_node(counted);
  r.set_world_size(static_cast<int>(world));
  r.set_procs_per_node_counted_on(request.node());
  // Nobody has joined this generation (the count was unknown): make it again at the run's shape.
  NewGeneration(run, run.gen->number);
  DT_LOG(Info) << "run " << r.run_id() << ": node " << request.node() << " counted " << counted
               << " processes per node (" << rule << "): world size " << world;
  Persist(run, deferred);
  Notify(run, deferred);
  return absl::OkStatus();
}

std::optional<absl::StatusOr<v1::RegisterResponse>> Coordinator::RegisterWithAssignedGeneration(
    RunEntry& run, const v1::RegisterRequest& request, Deferred& deferred) {
  Generation& g = *run.gen;
  const v1::Run& r = run.stored.run;
  if (g.node_ranks.empty()) {
    for (int i = 0; i < static_cast<int>(g.ranks.size()); ++i) {
      auto [it, added] = g.node_ranks.try_emplace(g.ranks[i].node(), i, 0);
      ++it->second.second;
    }
  }
  auto seat = g.ranks.end();
  if (auto node = g.node_ranks.find(request.node()); node != g.node_ranks.end()) {
    auto [first, count] = node->second;
    auto begin = g.ranks.begin() + first;
    seat = std::find_if(begin, begin + count,
                        [&](const v1::RankStatus& rs) { return rs.local_rank() == request.local_slot(); });
    if (seat == begin + count) seat = g.ranks.end();
  }
  if (seat == g.ranks.end()) {
    std::vector<std::string> nodes;
    for (const auto& rs : g.ranks) {
      if (nodes.size() == 16) {
        nodes.push_back(absl::StrCat("… (", g.node_ranks.size(), " nodes)"));
        break;
      }
      if (nodes.empty() || nodes.back() != rs.node()) nodes.push_back(rs.node());
    }
    return absl::FailedPreconditionError(absl::StrCat("node ", Quote(request.node()), " slot ", request.local_slot(),
                                                      " is not part of generation ", g.number, " of run ", r.run_id(),
                                                      ", whose ranks are on nodes ", absl::StrJoin(nodes, ", ")));
  }
  if (seat->incarnation() == request.incarnation()) {
    // A retry whose first reply was lost: same answer.
    Registrant reg;
    reg.node = seat->node();
    reg.local_slot = seat->local_rank();
    reg.incarnation = seat->incarnation();
    reg.host = seat->host();
    reg.pid = seat->pid();
    Assignment a{seat->rank(), seat->local_rank(), 0, seat->node_rank(), 0};
    a.local_world_size = g.node_ranks.at(seat->node()).second;
    a.nodes = g.ranks.empty() ? 0 : g.ranks.back().node_rank() + 1;
    return MakeRegisterResponse(run, Seat{reg, a});
  }
  // The same slot from a new process: the old one restarted, so its generation is over.
  v1::Failure failure;
  failure.set_kind(v1::Failure::REPLACED);
  failure.set_rank(seat->rank());
  failure.set_node(seat->node());
  failure.set_host(seat->host());
  failure.set_step(g.health ? g.health->step(seat->rank()) : 0);
  failure.set_message(absl::StrCat("was restarted: pid ", request.pid(), " on ", request.host(),
                                   " registered for its slot, replacing pid ", seat->pid()));
  FailGeneration(run, failure, deferred);  // replaces run.gen (or ends the run)
  if (IsTerminal(r.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", r.run_id(), " has ended ", StateName(r.state()), ": ", DescribeFailure(r.reason())));
  }
  return std::nullopt;  // register with the new generation
}

absl::Status Coordinator::AcceptingRegistrations() const {
  absl::MutexLock lock(&registry_mu_);
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down; register with its replacement");
  return absl::OkStatus();
}

absl::Status Coordinator::AdmitRegistrant(RunEntry& run, const v1::RegisterRequest& request, Deferred& deferred) {
  if (absl::Status s = CountProcsPerNode(run, request, deferred); !s.ok()) return s;
  return CheckRunAcceptsRegistration(run, request);
}

void Coordinator::Register(const v1::RegisterRequest& request, PendingPtr<v1::RegisterResponse> reply) {
  RunPtr run = OpenRegistration(ValidateRegisterRequest(request), request.run_id(), reply);
  if (run == nullptr) return;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  if (absl::Status s = AdmitRegistrant(*run, request, deferred); !s.ok()) {
    deferred.Complete<v1::RegisterResponse>(reply, s);
    return;
  }
  if (run->gen->assigned) {
    if (auto answered = RegisterWithAssignedGeneration(*run, request, deferred)) {
      deferred.Complete<v1::RegisterResponse>(reply, std::move(*answered));
      return;
    }
  }
  JoinRendezvous(run, request, reply, deferred);
}

Registrant Coordinator::MakeRegistrant(const v1::RegisterRequest& request, const void* call) const {
  return Registrant{request.node(),
                    request.local_slot(),
                    request.incarnation(),
                    request.host(),
                    request.pid(),
                    request.version(),
                    clock_->Now(),
                    call,
                    request.has_scheduler_task() ? std::optional<int>(request.scheduler_task()) : std::nullopt,
                    request.captures_stacks()};
}

absl::StatusOr<v1::RegisterResponse> Coordinator::AnswerSeat(const std::weak_ptr<RunEntry>& weak_run,
                                                             int64_t generation, const absl::StatusOr<Seat>& seat) {
  RunPtr run = weak_run.lock();
  if (!seat.ok()) return seat.status();
  if (!run) return absl::UnavailableError("the coordinator is shutting down");
  RunMutexLock lock(&run->mu);
  // The seats go out after the lock was released: the generation may have failed meanwhile.
  if (run->gen->number != generation || IsTerminal(run->stored.run.state())) {
    return LiveGeneration(*run, generation, seat->assignment.rank).status();
  }
  return MakeRegisterResponse(*run, *seat);
}

void Coordinator::JoinRendezvous(const RunPtr& run, const v1::RegisterRequest& request,
                                 const PendingPtr<v1::RegisterResponse>& reply, Deferred& deferred) {
  // The seat's reply builds the RegisterResponse once rendezvous completes.
  int64_t number = run->gen->number;
  // Weak: the pending lives in the run's own rendezvous; a strong reference would be a cycle.
  std::weak_ptr<RunEntry> weak_run = run;
  PendingPtr<Seat> seat_reply = MakePending<Seat>([this, weak_run, reply, number](absl::StatusOr<Seat> seat) {
    reply->Complete(AnswerSeat(weak_run, number, seat));
  });
  if (absl::Status s = SeatRegistrant(run, MakeRegistrant(request, reply.get()), seat_reply, deferred); !s.ok()) {
    deferred.Complete<v1::RegisterResponse>(reply, s);
    return;
  }
  CompleteRendezvousIfFull(*run, deferred);
}

absl::Status Coordinator::SeatRegistrant(const RunPtr& run, Registrant registrant, PendingPtr<Seat> seat_reply,
                                         Deferred& deferred) {
  v1::Run& r = run->stored.run;
  Generation& g = *run->gen;
  int64_t number = g.number;
  if (absl::Status s = g.rendezvous.Join(std::move(registrant), std::move(seat_reply), deferred); !s.ok()) return s;
  if (g.rendezvous_timer == 0) {
    std::string run_id = r.run_id();
    g.rendezvous_timer = timers_->Schedule(clock_->Now() + options_.timeouts.rendezvous_timeout,
                                           [this, run_id, number] { OnRendezvousTimeout(run_id, number); });
  }
  if (r.state() == v1::PENDING || r.state() == v1::RESTARTING || r.state() == v1::REQUEUED) {
    SetState(*run, v1::RENDEZVOUS, deferred);
  }
  return absl::OkStatus();
}

void Coordinator::CompleteRendezvousIfFull(RunEntry& run, Deferred& deferred) {
  if (!run.gen->assigned && run.gen->rendezvous.complete()) CompleteRendezvous(run, deferred);
}

void Coordinator::CompleteRendezvous(RunEntry& run, Deferred& deferred) {
  Generation& g = *run.gen;
  v1::Run& r = run.stored.run;
  if (g.rendezvous_timer != 0) timers_->Cancel(g.rendezvous_timer);
  std::vector<Seat> seats = g.rendezvous.Assign(deferred);
  absl::Time now = clock_->Now();
  std::optional<v1::CheckpointInfo> latest = Latest(run);
  int64_t start_step = latest ? latest->step() : 0;
  g.assigned = true;
  g.assigned_at = now;
  g.ranks.clear();
  std::vector<std::string> hosts;
  for (const Seat& seat : seats) {
    v1::RankStatus& rs = g.ranks.emplace_back();
    rs.set_rank(seat.assignment.rank);
    rs.set_local_rank(seat.assignment.local_rank);
    rs.set_node(seat.registrant.node);
    rs.set_node_rank(seat.assignment.node_rank);
    rs.set_host(seat.registrant.host);
    rs.set_pid(seat.registrant.pid);
    rs.set_state(v1::RankStatus::ACTIVE);
    rs.set_step(start_step);
    rs.set_incarnation(seat.registrant.incarnation);
    rs.set_generation(g.number);
    if (seat.registrant.scheduler_task) rs.set_scheduler_task(*seat.registrant.scheduler_task);
    rs.set_captures_stacks(seat.registrant.captures_stacks);
    *rs.mutable_last_heartbeat() = ToProtoTime(now);
    // The log names the first hosts; at 10,000 nodes the whole list would be a megabyte line.
    if ((hosts.empty() || hosts.back() != seat.registrant.host) && hosts.size() <= 16) {
      hosts.push_back(hosts.size() == 16 ? "…" : seat.registrant.host);
    }
  }
  g.health = std::make_unique<HealthTracker>(static_cast<int>(seats.size()), start_step, now,
                                             /*steps_expected=*/r.spec().exec_command().empty());
  r.set_world_size(static_cast<int>(seats.size()));
  r.set_step(start_step);
  DT_LOG(Info) << "run " << r.run_id() << " generation " << g.number << ": all " << seats.size()
               << " ranks registered on " << (seats.empty() ? 0 : seats.back().assignment.nodes) << " node(s) ("
               << absl::StrJoin(hosts, ", ") << ")"
               << (start_step > 0 ? absl::StrCat(", resuming from step ", start_step) : "");
  PersistRanks(run, deferred);
  WriteRunJson(run);
  SetState(run, v1::RUNNING, deferred);
}

void Coordinator::OnRendezvousTimeout(const std::string& run_id, int64_t generation) {
  absl::StatusOr<RunPtr> found = FindRun(run_id);
  if (!found.ok()) return;
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  Generation& g = *run->gen;
  if (g.number != generation || g.assigned || !g.stopped.ok() || IsTerminal(run->stored.run.state())) {
    return;
  }
  g.rendezvous_timer = 0;
  std::string message =
      absl::StrCat("rendezvous of generation ", generation, " timed out after ",
                   absl::FormatDuration(options_.timeouts.rendezvous_timeout), ": ", g.rendezvous.Describe());
  v1::Failure failure;
  failure.set_kind(v1::Failure::RENDEZVOUS_TIMEOUT);
  failure.set_rank(-1);
  failure.set_message(message);
  FailGeneration(*run, failure, deferred, absl::DeadlineExceededError(absl::StrCat("run ", run_id, ": ", message)));
}

void Coordinator::WithdrawRegistration(const std::string& run_id, const std::string& node, int local_slot,
                                       const std::string& incarnation, const void* call) {
  absl::StatusOr<RunPtr> found = FindRun(run_id);
  if (!found.ok()) return;
  RunPtr run = *found;
  RunMutexLock lock(&run->mu);
  if (!run->gen || run->gen->assigned) return;
  if (run->gen->rendezvous.Withdraw(node, local_slot, incarnation, call)) {
    DT_LOG(Info) << "run " << run_id << ": registration of " << node << "/" << local_slot
                 << " withdrawn (its caller went away)";
  }
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::RankHeartbeat beat;
  beat.set_rank(request.rank());
  beat.set_incarnation(request.incarnation());
  beat.set_step(request.step());
  beat.set_total_steps(request.total_steps());
  beat.set_worker_pid(request.worker_pid());
  beat.set_idle_ms(request.idle_ms());
  if (absl::Status s = ValidateRankHeartbeat(beat); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  RunMutexLock lock(&run->mu);
  return HeartbeatLocked(*run, request.generation(), beat, clock_->Now());
}

absl::StatusOr<v1::NodeHeartbeatResponse> Coordinator::NodeHeartbeat(const v1::NodeHeartbeatRequest& request) {
  if (absl::Status s = ValidateNodeHeartbeatRequest(request); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  v1::NodeHeartbeatResponse out;
  RunMutexLock lock(&run->mu);
  absl::Time now = clock_->Now();
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

absl::StatusOr<v1::HeartbeatResponse> Coordinator::HeartbeatLocked(RunEntry& run, int64_t generation,
                                                                   const v1::RankHeartbeat& beat, absl::Time now) {
  v1::Run& r = run.stored.run;
  Generation& g = *run.gen;
  v1::HeartbeatResponse out;
  out.set_run_state(r.state());
  out.set_current_generation(g.number);
  if (generation < g.number || IsTerminal(r.state())) {
    absl::StatusOr<Generation*> live = LiveGeneration(run, generation, beat.rank());
    out.set_directive(v1::HeartbeatResponse::STOP);
    out.set_reason(std::string(live.status().message()));
    return out;
  }
  absl::StatusOr<Generation*> live = LiveGeneration(run, generation, beat.rank());
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

absl::StatusOr<v1::ReportErrorResponse> Coordinator::ReportError(const v1::ReportErrorRequest& request) {
  if (absl::Status s = ValidateReportErrorRequest(request); !s.ok()) return s;
  const bool by_task = request.has_scheduler_task();
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
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
    return LiveGeneration(*run, request.generation(), 0).status();
  }
  if (request.generation() > g.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", request.generation(), " of run ", r.run_id(), " does not exist"));
  }
  int world = WorldSize(r.spec());
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
  FailGeneration(*run, failure, deferred);
  out.set_run_state(r.state());
  out.set_current_generation(run->gen->number);
  return out;
}

absl::StatusOr<int> Coordinator::ReportedRank(RunEntry& run, const v1::ReportErrorRequest& request) {
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

absl::StatusOr<Coordinator::Generation*> Coordinator::AssignedRank(RunEntry& run, int64_t generation, int rank,
                                                                   const std::string& incarnation) {
  absl::StatusOr<Generation*> live = LiveGeneration(run, generation, rank);
  if (!live.ok()) return live.status();
  Generation& g = **live;
  if (!g.assigned) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", g.number, " of run ", run.stored.run.run_id(), " has not completed rendezvous"));
  }
  const v1::RankStatus& status = g.ranks[rank];
  if (status.incarnation() != incarnation) {
    return absl::AbortedError(
        absl::StrCat("rank ", rank, " belongs to incarnation ", status.incarnation(), "; this process was replaced"));
  }
  return &g;
}

absl::StatusOr<v1::ReportStoppedResponse> Coordinator::ReportStopped(const v1::ReportStoppedRequest& request) {
  if (request.signal() < 1 || request.signal() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("signal must be within 1..64, not ", request.signal()));
  }
  if (request.step() < 0) return absl::InvalidArgumentError("step must not be negative");
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  v1::ReportStoppedResponse out;
  out.set_run_state(r.state());
  out.set_current_generation(run->gen->number);
  // A victim of a generation that already ended (the launcher stops the others afterwards).
  if (IsTerminal(r.state()) || request.generation() < run->gen->number) return out;
  absl::StatusOr<Generation*> live = AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
  if (!live.ok()) return live.status();
  Generation& g = **live;
  v1::RankStatus& rank = g.ranks[request.rank()];
  if (rank.state() == v1::RankStatus::ACTIVE) {
    g.health->Heartbeat(request.rank(), request.step(), clock_->Now());
    g.health->Stop(request.rank(), request.signal(), clock_->Now());
    rank.set_state(v1::RankStatus::STOPPED);
    g.ranks_dirty = g.rows_dirty = true;
    DT_LOG(Info) << "run " << r.run_id() << " generation " << g.number << ": " << DescribeRank(*run, request.rank())
                 << " was stopped by " << SignalName(request.signal()) << " at step " << request.step();
    Notify(*run, deferred);
  }
  return out;
}

absl::StatusOr<v1::ReportPreflightResponse> Coordinator::ReportPreflight(const v1::ReportPreflightRequest& request) {
  if (absl::Status s = ValidateReportPreflightRequest(request); !s.ok()) return s;
  const v1::DevicePreflight& result = request.result();
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  if (IsTerminal(r.state())) return RunEndedError(r);
  absl::StatusOr<Generation*> live = AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
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
      std::vector<UnhealthyRank> bad = JudgePreflights(reports, options_.preflight, judge_speed);
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

void Coordinator::FailUnhealthy(RunEntry& run, const std::vector<UnhealthyRank>& bad, Deferred& deferred) {
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
      absl::StrAppend(&message, k == 1 ? "; also " : ", ", DescribeRank(run, bad[k].rank), ": ", bad[k].why);
  }
  if (r.spec().scheduler() == v1::SLURM || r.spec().scheduler() == v1::EXTERNAL) {
    std::vector<std::string> added = AddExcludedNodes(run, nodes);
    if (!added.empty()) {
      absl::StrAppend(&message, "; node", added.size() > 1 ? "s " : " ", absl::StrJoin(added, ", "),
                      " excluded from the job, which runs again without ", added.size() > 1 ? "them" : "it");
    }
  }
  failure.set_message(message);
  FailGeneration(run, failure, deferred);
}

absl::StatusOr<v1::LeaveResponse> Coordinator::Leave(const v1::LeaveRequest& request) {
  if (request.final_step() < 0) return absl::InvalidArgumentError("final step must not be negative");
  if (request.signal() < 0 || request.signal() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("signal must be within 0..64, not ", request.signal()));
  }
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  v1::LeaveResponse out;
  if (r.state() == v1::SUCCEEDED && request.generation() == run->gen->number) {
    out.set_run_state(r.state());
    return out;  // a retry after the last rank left
  }
  absl::StatusOr<Generation*> live = AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
  if (!live.ok()) return live.status();
  Generation& g = **live;
  v1::RankStatus& rank = g.ranks[request.rank()];
  if (rank.state() != v1::RankStatus::FINISHED) {
    g.health->Heartbeat(request.rank(), request.final_step(), clock_->Now());
    g.health->Finish(request.rank(), clock_->Now());
    rank.set_state(v1::RankStatus::FINISHED);
    g.ranks_dirty = g.rows_dirty = true;
    if (request.preempted()) g.preempted_by = request.signal() > 0 ? request.signal() : SIGUSR2;
    g.time_limit = g.time_limit || (request.preempted() && request.time_limit());
    ExcuseFromCapture(*run, request.rank(), deferred);  // a rank that left has no stacks to give
  }
  if (g.health->all_finished()) {
    int64_t final_step = 0;
    for (const auto& rs : g.ranks) final_step = std::max(final_step, g.health->step(rs.rank()));
    r.set_step(final_step);
    if (g.preempted_by != 0) {
      RequeueGeneration(*run, g.preempted_by, deferred);
    } else {
      PersistRanks(*run, deferred);
      StopGeneration(*run, absl::AbortedError(absl::StrCat("run ", r.run_id(), " has succeeded")), deferred);
      SetState(*run, v1::SUCCEEDED, deferred);
    }
  }
  out.set_run_state(r.state());
  return out;
}

std::string Coordinator::DescribeStopped(const RunEntry& run, const std::vector<StoppedRank>& stopped) const {
  std::string out;
  for (size_t k = 0; k < stopped.size(); ++k) {
    if (k == 16) {
      absl::StrAppend(&out, ", and ", stopped.size() - k, " more");
      break;
    }
    absl::StrAppend(&out, k == 0 ? "" : ", ", DescribeRank(run, stopped[k].rank), " at ",
                    absl::FormatTime("%H:%M:%E3S", stopped[k].when, absl::UTCTimeZone()), " by ",
                    SignalName(stopped[k].signal));
  }
  return out;
}

v1::Failure Coordinator::VerdictFailure(const RunEntry& run, const HealthVerdict& verdict) const {
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
        absl::StrAppend(&others, k == 0 ? "; also silent: " : ", ", DescribeRank(run, rank), " since ",
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
                                          DescribeStopped(run, verdict.stopped),
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

void Coordinator::CheckHealth() {
  absl::Time now = clock_->Now();
  for (const RunPtr& run : AllRuns()) {
    LockedRun locked(*run);
    Deferred& deferred = locked.deferred();
    if (IsTerminal(run->stored.run.state()) || !run->gen) continue;
    Generation& g = *run->gen;
    if (!g.assigned || !g.stopped.ok()) continue;
    // A hang's capture is under way: its completion fails the generation with the evidence.
    if (g.capture && g.capture->hang) continue;
    HealthTimeouts limits{options_.timeouts.heartbeat_timeout, options_.timeouts.hang_timeout,
                          options_.timeouts.rendezvous_timeout, IdleTimeout(run->stored.run.spec())};
    if (std::optional<HealthVerdict> verdict = g.health->Check(now, limits)) {
      v1::Failure failure = VerdictFailure(*run, *verdict);
      bool hang = verdict->kind == HealthVerdict::Kind::kHang || verdict->kind == HealthVerdict::Kind::kIdle;
      // Evidence before the kill: every rank's stacks, captured while every process still lives.
      if (!hang || !BeginCapture(*run, failure.message(), failure, nullptr, deferred)) {
        FailGeneration(*run, failure, deferred);
      }
      continue;
    }
    if (g.ranks_dirty && now - g.last_flush >= absl::Seconds(2)) FlushProgress(run);
  }
}

}  // namespace dt
