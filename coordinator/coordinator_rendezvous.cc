// Rendezvous: registration, seats and assignments, the rendezvous timeout, withdrawn registrations.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/request_checks.h"

namespace dt {
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
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
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
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  if (!run->gen || run->gen->assigned) return;
  if (run->gen->rendezvous.Withdraw(node, local_slot, incarnation, call)) {
    DT_LOG(Info) << "run " << run_id << ": registration of " << node << "/" << local_slot
                 << " withdrawn (its caller went away)";
  }
}

}  // namespace dt
