// Rank registration (rank_registration.h): Register, RegisterNode, their seats and assignments, the
// rendezvous timeout, withdrawn registrations.
#include "coordinator/rank_registration.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/node_seats.h"
#include "coordinator/request_checks.h"
#include "coordinator/run_persistence.h"

namespace dt {

v1::RegisterResponse Coordinator::RankRegistration::MakeRegisterResponse(const RunEntry& run, const Seat& seat) const {
  const v1::Run& r = run.stored.run;
  v1::RegisterResponse out;
  out.set_run_id(r.run_id());
  out.set_rank(seat.assignment.rank);
  out.set_world_size(r.world_size());  // the generation's (an elastic run's may be smaller than the spec's)
  out.set_local_rank(seat.assignment.local_rank);
  out.set_local_world_size(seat.assignment.local_world_size);
  out.set_node_rank(seat.assignment.node_rank);
  out.set_nodes(seat.assignment.nodes);
  out.set_generation(r.generation());
  out.set_exp_dir(r.exp_dir());
  if (std::optional<v1::CheckpointInfo> latest = coordinator_.Latest(run)) *out.mutable_resume() = *latest;
  *out.mutable_spec() = r.spec();
  *out.mutable_timeouts() = coordinator_.policy_;
  out.set_restarts(r.restarts());
  return out;
}

absl::Status Coordinator::RankRegistration::CheckRunAcceptsRegistration(const RunEntry& run,
                                                                        const v1::RegisterRequest& request) const {
  const v1::Run& r = run.stored.run;
  if (IsTerminal(r.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", r.run_id(), " has ended ", StateName(r.state()),
                     r.has_reason() ? absl::StrCat(" (", DescribeFailure(r.reason()), ")") : "",
                     "; submit a new run to train again"));
  }
  const v1::RunSpec& spec = r.spec();
  const v1::WorldView& view = request.expected();
  // The current generation's shape: an elastic run's shrunk generation has fewer nodes.
  int nodes = r.generation_nodes_size() > 0 ? r.generation_nodes_size() : spec.nodes();
  int world = r.world_size();
  if ((view.world_size() != 0 && view.world_size() != world) || (view.nodes() != 0 && view.nodes() != nodes) ||
      (view.procs_per_node() != 0 && view.procs_per_node() != spec.procs_per_node())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the trainer on ", request.host(), " expects world size ", view.world_size(), " (", view.nodes(), " nodes x ",
        view.procs_per_node(), " per node) but run ", r.run_id(), " has world size ", world, " (", nodes, " nodes x ",
        spec.procs_per_node(), " per node",
        nodes == spec.nodes() ? "" : absl::StrCat(" in generation ", r.generation(), ", of its ", spec.nodes()),
        nodes == spec.nodes() ? "); start the trainers with the run's shape instead of forming a smaller world"
                              : absl::StrCat("); start this generation's trainers with --nnodes ", nodes)));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::RankRegistration::CountProcsPerNode(RunEntry& run, const v1::RegisterRequest& request,
                                                              Deferred& deferred) {
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
    admitted = coordinator_.admission_.Admit(
        world - run.ranks_admitted, absl::StrCat("run ", r.run_id(), " (", spec.nodes(), " nodes x ", counted, " = ",
                                                 world, " ranks, ", run.ranks_admitted, " of them held already)"));
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
    coordinator_.FailGeneration(run, failure, deferred);
    std::string ended = absl::StrCat("run ", r.run_id(), " ended: ", wrong);
    return admitted.ok() ? absl::FailedPreconditionError(ended) : absl::ResourceExhaustedError(ended);
  }
  if (spec.procs_per_node() > 0) return absl::OkStatus();
  spec.set_procs_per_node(counted);
  r.set_world_size(static_cast<int>(world));
  r.set_procs_per_node_counted_on(request.node());
  // Nobody has joined this generation (the count was unknown): make it again at the run's shape.
  coordinator_.NewGeneration(run, run.gen->number);
  DT_LOG(Info) << "run " << r.run_id() << ": node " << request.node() << " counted " << counted
               << " processes per node (" << rule << "): world size " << world;
  coordinator_.persistence_->Persist(run, deferred);
  coordinator_.Notify(run, deferred);
  return absl::OkStatus();
}

std::optional<absl::StatusOr<v1::RegisterResponse>> Coordinator::RankRegistration::RegisterWithAssignedGeneration(
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
  coordinator_.FailGeneration(run, failure, deferred);  // replaces run.gen (or ends the run)
  if (IsTerminal(r.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", r.run_id(), " has ended ", StateName(r.state()), ": ", DescribeFailure(r.reason())));
  }
  return std::nullopt;  // register with the new generation
}

absl::Status Coordinator::RankRegistration::AcceptingRegistrations() const {
  absl::MutexLock lock(&coordinator_.registry_mu_);
  if (coordinator_.shutting_down_)
    return absl::UnavailableError("the coordinator is shutting down; register with its replacement");
  return absl::OkStatus();
}

absl::Status Coordinator::RankRegistration::AdmitRegistrant(RunEntry& run, const v1::RegisterRequest& request,
                                                            Deferred& deferred) {
  if (absl::Status s = CountProcsPerNode(run, request, deferred); !s.ok()) return s;
  return CheckRunAcceptsRegistration(run, request);
}

void Coordinator::RankRegistration::Register(const v1::RegisterRequest& request,
                                             PendingPtr<v1::RegisterResponse> reply) {
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

Registrant Coordinator::RankRegistration::MakeRegistrant(const v1::RegisterRequest& request, const void* call) const {
  return Registrant{request.node(),
                    request.local_slot(),
                    request.incarnation(),
                    request.host(),
                    request.pid(),
                    request.version(),
                    coordinator_.clock_->Now(),
                    call,
                    request.has_scheduler_task() ? std::optional<int>(request.scheduler_task()) : std::nullopt,
                    request.captures_stacks()};
}

absl::StatusOr<v1::RegisterResponse> Coordinator::RankRegistration::AnswerSeat(const std::weak_ptr<RunEntry>& weak_run,
                                                                               int64_t generation,
                                                                               const absl::StatusOr<Seat>& seat) {
  RunPtr run = weak_run.lock();
  if (!seat.ok()) return seat.status();
  if (!run) return absl::UnavailableError("the coordinator is shutting down");
  RunMutexLock lock(&run->mu);
  // The seats go out after the lock was released: the generation may have failed meanwhile.
  if (run->gen->number != generation || IsTerminal(run->stored.run.state())) {
    return coordinator_.LiveGeneration(*run, generation, seat->assignment.rank).status();
  }
  return MakeRegisterResponse(*run, *seat);
}

void Coordinator::RankRegistration::JoinRendezvous(const RunPtr& run, const v1::RegisterRequest& request,
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

absl::Status Coordinator::RankRegistration::SeatRegistrant(const RunPtr& run, Registrant registrant,
                                                           PendingPtr<Seat> seat_reply, Deferred& deferred) {
  v1::Run& r = run->stored.run;
  Generation& g = *run->gen;
  int64_t number = g.number;
  if (absl::Status s = g.rendezvous.Join(std::move(registrant), std::move(seat_reply), deferred); !s.ok()) return s;
  if (g.rendezvous_timer == 0) {
    std::string run_id = r.run_id();
    absl::Time deadline = coordinator_.clock_->Now() + coordinator_.options_.timeouts.rendezvous_timeout;
    g.rendezvous_deadline = deadline;
    g.rendezvous_timer = coordinator_.timers_->Schedule(
        deadline, [this, run_id, number, deadline] { OnRendezvousTimeout(run_id, number, deadline); });
  }
  if (r.state() == v1::PENDING || r.state() == v1::RESTARTING || r.state() == v1::REQUEUED) {
    coordinator_.SetState(*run, v1::RENDEZVOUS, deferred);
  }
  return absl::OkStatus();
}

void Coordinator::RankRegistration::CompleteRendezvousIfFull(RunEntry& run, Deferred& deferred) {
  if (!run.gen->assigned && run.gen->rendezvous.complete()) CompleteRendezvous(run, deferred);
}

void Coordinator::RankRegistration::CompleteRendezvous(RunEntry& run, Deferred& deferred) {
  Generation& g = *run.gen;
  v1::Run& r = run.stored.run;
  if (g.rendezvous_timer != 0) coordinator_.timers_->Cancel(g.rendezvous_timer);
  std::vector<Seat> seats = g.rendezvous.Assign(deferred);
  absl::Time now = coordinator_.clock_->Now();
  std::optional<v1::CheckpointInfo> latest = coordinator_.Latest(run);
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
  coordinator_.persistence_->PersistRanks(run, deferred);
  coordinator_.persistence_->WriteRunJson(run);
  coordinator_.SetState(run, v1::RUNNING, deferred);
}

void Coordinator::RankRegistration::OnRendezvousTimeout(const std::string& run_id, int64_t generation,
                                                        absl::Time deadline) {
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  Deferred& deferred = locked.deferred();
  Generation& g = *run->gen;
  if (g.number != generation || g.rendezvous_deadline != deadline || g.assigned || !g.stopped.ok() ||
      IsTerminal(run->stored.run.state())) {
    return;
  }
  g.rendezvous_timer = 0;
  std::string message = absl::StrCat("rendezvous of generation ", generation, " timed out after ",
                                     absl::FormatDuration(coordinator_.options_.timeouts.rendezvous_timeout), ": ",
                                     g.rendezvous.Describe());
  v1::Failure failure;
  failure.set_kind(v1::Failure::RENDEZVOUS_TIMEOUT);
  failure.set_rank(-1);
  failure.set_message(message);
  coordinator_.FailGeneration(*run, failure, deferred,
                              absl::DeadlineExceededError(absl::StrCat("run ", run_id, ": ", message)));
}

void Coordinator::RankRegistration::WithdrawRegistration(const std::string& run_id, const std::string& node,
                                                         int local_slot, const std::string& incarnation,
                                                         const void* call) {
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  if (!run->gen || run->gen->assigned) return;
  if (run->gen->rendezvous.Withdraw(node, local_slot, incarnation, call)) {
    DT_LOG(Info) << "run " << run_id << ": registration of " << node << "/" << local_slot
                 << " withdrawn (its caller went away)";
  }
}

void Coordinator::RankRegistration::RegisterNode(const v1::RegisterNodeRequest& request,
                                                 PendingPtr<v1::RegisterNodeResponse> reply) {
  absl::StatusOr<std::vector<v1::RegisterRequest>> checked = NodeSlotRequests(request);
  RunPtr run = OpenRegistration(checked.status(), request.run_id(), reply);
  if (run == nullptr) return;
  const std::vector<v1::RegisterRequest>& slots = *checked;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  if (absl::Status s = AdmitRegistrant(*run, slots.front(), deferred); !s.ok()) {
    deferred.Complete<v1::RegisterNodeResponse>(reply, s);
    return;
  }
  if (run->gen->assigned) {
    if (auto answered = RegisterNodeWithAssignedGeneration(*run, slots, deferred)) {
      deferred.Complete<v1::RegisterNodeResponse>(reply, std::move(*answered));
      return;
    }
  }
  JoinRendezvousAsNode(run, request, slots, reply, deferred);
}

std::optional<absl::StatusOr<v1::RegisterNodeResponse>>
Coordinator::RankRegistration::RegisterNodeWithAssignedGeneration(RunEntry& run,
                                                                  const std::vector<v1::RegisterRequest>& slots,
                                                                  Deferred& deferred) {
  std::vector<v1::RegisterResponse> answers;
  for (const v1::RegisterRequest& slot : slots) {
    std::optional<absl::StatusOr<v1::RegisterResponse>> answered = RegisterWithAssignedGeneration(run, slot, deferred);
    if (!answered) return std::nullopt;  // a slot restarted: the generation failed; all join the next one
    if (!answered->ok()) return answered->status();
    answers.push_back(std::move(**answered));
  }
  return MakeNodeResponse(slots, std::move(answers));
}

void Coordinator::RankRegistration::JoinRendezvousAsNode(const RunPtr& run, const v1::RegisterNodeRequest& request,
                                                         const std::vector<v1::RegisterRequest>& slots,
                                                         const PendingPtr<v1::RegisterNodeResponse>& reply,
                                                         Deferred& deferred) {
  // Checked before any slot is seated: after that, seating cannot fail halfway.
  for (const v1::RegisterRequest& slot : slots) {
    if (absl::Status s = run->gen->rendezvous.Admits(slot.node(), slot.local_slot()); !s.ok()) {
      deferred.Complete<v1::RegisterNodeResponse>(reply, s);
      return;
    }
  }
  int64_t number = run->gen->number;
  std::weak_ptr<RunEntry> weak_run = run;
  auto seats = NodeSeats::Make(static_cast<int>(slots.size()), [this, weak_run, reply, number,
                                                                request](absl::StatusOr<std::vector<Seat>> seats) {
    if (!seats.ok()) {
      // One slot's wait ended (replaced by another call, or the generation failed): the call's
      // other slots leave the rendezvous with it, as the proto promises.
      WithdrawNodeRegistration(request, reply.get());
      reply->Complete(seats.status());
      return;
    }
    absl::StatusOr<v1::RegisterResponse> shared = AnswerSeat(weak_run, number, seats->front());
    if (!shared.ok()) {
      reply->Complete(shared.status());
      return;
    }
    reply->Complete(MakeNodeResponse(std::move(*shared), *seats));
  });
  for (size_t i = 0; i < slots.size(); ++i) {
    absl::Status s =
        SeatRegistrant(run, MakeRegistrant(slots[i], reply.get()), seats->SlotReply(static_cast<int>(i)), deferred);
    if (!s.ok()) {  // Admits passed, so this is not expected; nothing of the call stays seated
      for (size_t j = 0; j < i; ++j) {
        run->gen->rendezvous.Withdraw(slots[j].node(), slots[j].local_slot(), slots[j].incarnation(), reply.get());
      }
      deferred.Complete<v1::RegisterNodeResponse>(reply, s);
      return;
    }
  }
  // Once every slot of the call is seated: a slot already held by an earlier call of the same
  // agent (a retry) does not add to the count, so the rendezvous may fill before the last slot.
  CompleteRendezvousIfFull(*run, deferred);
}

void Coordinator::RankRegistration::WithdrawNodeRegistration(const v1::RegisterNodeRequest& request, const void* call) {
  // All of the call's slots under one lock: a retry cannot land between them.
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, request.run_id());
  if (!run->gen || run->gen->assigned) return;
  int withdrawn = 0;
  for (const v1::NodeSlot& slot : request.slots()) {
    withdrawn += run->gen->rendezvous.Withdraw(request.node(), slot.local_slot(), slot.incarnation(), call) ? 1 : 0;
  }
  if (withdrawn > 0) {
    DT_LOG(Info) << "run " << request.run_id() << ": " << withdrawn << " slot(s) of node " << request.node()
                 << " withdrawn (their call ended)";
  }
}

}  // namespace dt
