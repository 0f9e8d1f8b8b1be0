// Run lifecycle: generations, the run's states, failures and restarts. What it decides is
// written by the run's persistence (run_persistence.h).
#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/run_state.h"
#include "common/stop_signals.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/repeated_failures.h"
#include "coordinator/run_persistence.h"
#include "coordinator/stack_captures.h"

namespace dt {
namespace {

// A program that reports no steps: a failure this soon after the generation formed counts as
// before its first step.
constexpr absl::Duration kEarlyFailureWindow = absl::Minutes(1);

// Generations an elastic run's record keeps (Run.generations): the newest.
constexpr int kGenerationShapesKept = 64;

// Records generation `number`'s size in the run: its world size and, for an elastic run, its nodes
// and its entry in the run's generations (replaced when the generation is made again).
void RecordGenerationShape(v1::Run& r, int64_t number, int nodes, int world, const NextNodes& shape) {
  r.set_world_size(world);
  *r.mutable_generation_nodes() = {shape.nodes.begin(), shape.nodes.end()};
  *r.mutable_lost_nodes() = {shape.lost.begin(), shape.lost.end()};
  if (r.spec().min_nodes() <= 0) return;
  auto* shapes = r.mutable_generations();
  if (shapes->empty() || shapes->rbegin()->generation() != number) shapes->Add();
  v1::GenerationShape& entry = *shapes->rbegin();
  entry.set_generation(number);
  entry.set_nodes(nodes);
  entry.set_world_size(world);
  *entry.mutable_lost_nodes() = {shape.lost.begin(), shape.lost.end()};
  if (shapes->size() > kGenerationShapesKept) shapes->DeleteSubrange(0, shapes->size() - kGenerationShapesKept);
}

}  // namespace

std::optional<v1::CheckpointInfo> Coordinator::Latest(const RunEntry& run) const {
  if (!run.checkpoints.empty()) return run.checkpoints.back();
  return run.stored.resume_from;
}

bool Coordinator::BeforeFirstStep(const RunEntry& run, int rank) const {
  const Generation& g = *run.gen;
  if (!g.assigned || !g.health) return true;  // the rendezvous has not completed
  bool steps_expected = run.stored.run.spec().exec_command().empty();
  if (steps_expected || g.health->step_reported()) return g.health->step(rank) <= g.health->start_step();
  return clock_->Now() - g.assigned_at <= kEarlyFailureWindow;
}

void Coordinator::NewGeneration(RunEntry& run, int64_t number) {
  const v1::Run& r = run.stored.run;
  NextNodes recorded;
  recorded.nodes.assign(r.generation_nodes().begin(), r.generation_nodes().end());
  recorded.lost.assign(r.lost_nodes().begin(), r.lost_nodes().end());
  NewGeneration(run, number, recorded);
}

void Coordinator::NewGeneration(RunEntry& run, int64_t number, const NextNodes& shape) {
  v1::Run& r = run.stored.run;
  const v1::RunSpec& spec = r.spec();
  int nodes = shape.nodes.empty() ? spec.nodes() : static_cast<int>(shape.nodes.size());
  int world = nodes * spec.procs_per_node();
  RecordGenerationShape(r, number, nodes, world, shape);
  auto gen = std::make_unique<Generation>(number, nodes, spec.procs_per_node(), shape.nodes);
  std::string run_id = r.run_id();
  std::string scope = absl::StrCat("run ", run_id, " generation ", number);
  gen->store = std::make_shared<KvStore>(
      scope, timers_, StoreLimits{options_.max_keys_per_run, options_.store_bytes_per_run, &store_budget_});
  RunEntry* entry = &run;
  // Barrier timeouts arrive on the timer thread: the hook finds the run and takes its lock first.
  gen->barriers = std::make_unique<BarrierTable>(
      scope, world, clock_, timers_,
      [this, entry](int rank) ABSL_NO_THREAD_SAFETY_ANALYSIS { return DescribeRank(*entry, rank); },
      [this, run_id, number](absl::Time when, const std::string& name, uint64_t sequence) {
        return timers_->Schedule(when, [this, run_id, number, name, sequence] {
          DT_OPEN_RUN_OR_RETURN_VOID(r, locked, run_id);
          Deferred& deferred = locked.deferred();
          if (r->gen && r->gen->number == number) r->gen->barriers->Expire(name, sequence, deferred);
        });
      },
      options_.max_barrier_names);
  run.gen = std::move(gen);
  r.set_generation(number);
}

void Coordinator::WholeAgainAfterRequeue(RunEntry& run, Deferred& deferred) {
  v1::Run& r = run.stored.run;
  if (r.spec().min_nodes() <= 0 || r.generation_nodes_size() == 0 || run.gen == nullptr) return;
  Generation& g = *run.gen;
  // A formed generation is the old job's: its ranks end with that job, and the failure that
  // follows finds every node silent, which restarts at full size.
  if (g.assigned || !g.stopped.ok()) return;
  int64_t number = g.number;
  std::string shrunk = absl::StrJoin(r.generation_nodes(), ", ");
  StopGeneration(run,
                 absl::AbortedError(absl::StrCat("the job of run ", r.run_id(), " was requeued: generation ", number,
                                                 " forms again on its whole new allocation, not on ", shrunk)),
                 deferred);
  NewGeneration(run, number, NextNodes{});  // destroys `g`
  DT_LOG(Info) << "run " << r.run_id() << ": the job was requeued with a whole allocation: generation " << number
               << " forms on all " << r.spec().nodes() << " nodes (" << r.world_size() << " ranks), not on " << shrunk;
}

NextNodes Coordinator::ElasticNextNodes(const RunEntry& run, const std::vector<std::string>& silent) const {
  const Generation& g = *run.gen;
  const v1::Run& r = run.stored.run;
  const v1::RunSpec& spec = r.spec();
  // Under Slurm a node lost inside the job's allocation (--no-kill) does not come back to it: a
  // restart for another cause keeps the nodes that remain. A requeue forms at MAX again.
  NextNodes kept;
  if (spec.scheduler() == v1::SLURM && r.generation_nodes_size() > 0) {
    kept.nodes.assign(r.generation_nodes().begin(), r.generation_nodes().end());
    kept.lost.assign(r.lost_nodes().begin(), r.lost_nodes().end());
  }
  // Only a heartbeat timeout of a formed generation finds silent nodes (FailGeneration).
  if (spec.min_nodes() <= 0 || silent.empty()) return kept;
  std::vector<std::string> nodes;
  for (const v1::RankStatus& rank : g.ranks) {
    if (nodes.empty() || nodes.back() != rank.node()) nodes.push_back(rank.node());
  }
  NextNodes next = NextGenerationNodes(nodes, silent, spec.min_nodes());
  // Fewer than MIN left: full size (under Slurm, a requeue without the lost nodes).
  if (next.nodes.empty()) return next;
  // The nodes lost by the shrinks before this one stay lost until the world is full again.
  std::vector<std::string> lost(r.lost_nodes().begin(), r.lost_nodes().end());
  for (std::string& node : next.lost) {
    if (!absl::c_linear_search(lost, node)) lost.push_back(std::move(node));
  }
  next.lost = std::move(lost);
  return next;
}

std::vector<std::string> Coordinator::SilentNodes(const RunEntry& run) const {
  const Generation& g = *run.gen;
  if (!g.assigned || !g.health) return {};
  // The first silent rank is past the timeout; the other ranks of a lost node stopped within one
  // heartbeat interval of it. A live rank is never silent for two intervals. With a timeout under
  // four intervals the two cannot be told apart.
  absl::Duration interval = absl::Milliseconds(policy_.heartbeat_interval_ms());
  absl::Duration threshold = absl::Milliseconds(policy_.heartbeat_timeout_ms()) - 2 * interval;
  if (threshold < 2 * interval) return {};
  absl::Time now = clock_->Now();
  std::vector<RankSilence> ranks;
  for (const v1::RankStatus& rank : g.ranks) {
    ranks.push_back({rank.node(), now - g.health->last_heartbeat(rank.rank()), g.health->finished(rank.rank())});
  }
  return LostNodes(ranks, threshold);
}

void Coordinator::HandTheJobToNodesThatRemainIfTheBatchHostIsLost(RunEntry& run, const std::vector<std::string>& silent,
                                                                  bool cancel) {
  const v1::Run& r = run.stored.run;
  const v1::RunSpec& spec = r.spec();
  // Only an elastic run's job is --no-kill; any other job ends NODE_FAIL and Slurm requeues it.
  if (spec.scheduler() != v1::SLURM || spec.min_nodes() <= 0 || r.batch_host().empty() ||
      r.scheduler_job_id().empty()) {
    return;
  }
  if (!absl::c_linear_search(silent, r.batch_host())) return;
  v1::OrphanedJob job;
  job.set_cancel(cancel);
  job.set_job(r.scheduler_job_id());
  job.set_batch_host(r.batch_host());
  job.set_generation(run.gen->number);
  for (const v1::RankStatus& rank : run.gen->ranks) {
    if (absl::c_linear_search(silent, rank.node())) continue;
    if (!absl::c_linear_search(job.nodes(), rank.node())) {
      if (job.nodes_size() == kNodesThatMayActOnTheJob) continue;
      job.add_nodes(rank.node());
    }
    job.add_ranks(rank.rank());
  }
  // Every node silent: most often the whole job ended (its time limit, a scancel, a requeue whose
  // script waits to attach), and nobody is left to ask anyway.
  if (job.ranks().empty()) return;
  DT_LOG(Warning) << "run " << r.run_id() << ": node " << job.batch_host() << ", the batch host of job " << job.job()
                  << ", is lost: a rank on " << absl::StrJoin(job.nodes(), ", ") << " will "
                  << (cancel ? "cancel" : "requeue") << " the job";
  *run.stored.run.mutable_orphaned_job() = std::move(job);
}

std::string Coordinator::DescribeRank(const RunEntry& run, int rank) const {
  if (run.gen && run.gen->assigned && rank >= 0 && rank < static_cast<int>(run.gen->ranks.size())) {
    const v1::RankStatus& r = run.gen->ranks[rank];
    return absl::StrCat("rank ", rank, " (node ", r.node(), ", host ", r.host(), ")");
  }
  return absl::StrCat("rank ", rank);
}

void Coordinator::SetState(RunEntry& run, v1::RunState state, Deferred& deferred) {
  v1::Run& r = run.stored.run;
  if (r.state() == state) return;
  v1::RunState old = r.state();
  r.set_state(state);
  absl::Time now = clock_->Now();
  *r.mutable_updated_at() = ToProtoTime(now);
  if (IsTerminal(state)) *r.mutable_ended_at() = ToProtoTime(now);
  if (IsTerminal(state) && !IsTerminal(old)) {
    admission_.Release(run.ranks_admitted);
    run.ranks_admitted = 0;
  }
  // A requeue is for a run that goes on; a cancel stays, as the record of what was done.
  if (IsTerminal(state) && r.has_orphaned_job() && !r.orphaned_job().cancel()) r.clear_orphaned_job();
  std::string detail;
  if (state == v1::RUNNING) {
    detail = absl::StrCat(" (generation ", r.generation(), ", ", r.world_size(), " ranks)");
  } else if (state == v1::RESTARTING || state == v1::REQUEUED || state == v1::FAILED || state == v1::CANCELLED) {
    detail = absl::StrCat(": ", DescribeFailure(r.reason()));
  }
  DT_LOG(Info) << "run " << r.run_id() << " (" << r.spec().experiment_name() << ") " << StateName(old) << " -> "
               << StateName(state) << detail;
  persistence_->Persist(run, deferred);
  Notify(run, deferred);
}

v1::Run Coordinator::Snapshot(const RunEntry& run, bool with_ranks) const {
  v1::Run r = run.stored.run;
  r.set_revision(run.revision);
  const Generation* g = run.gen.get();
  if (g != nullptr && g->health) r.set_step(g->health->group_step());
  std::optional<v1::CheckpointInfo> latest = Latest(run);
  r.set_latest_checkpoint_step(latest ? latest->step() : -1);
  if (!with_ranks) return r;
  for (const auto& f : run.failures) *r.add_failures() = f;
  if (g == nullptr) return r;
  if (g->barriers) {
    for (v1::OpenBarrier& b : g->barriers->Open()) *r.add_open_barriers() = std::move(b);
  }
  if (g->assigned) {
    for (const auto& rank : g->ranks) {
      v1::RankStatus* out = r.add_ranks();
      *out = rank;
      if (g->health) {
        out->set_step(g->health->step(rank.rank()));
        *out->mutable_last_heartbeat() = ToProtoTime(g->health->last_heartbeat(rank.rank()));
      }
    }
  } else {
    for (const Registrant& reg : g->rendezvous.registrants()) {
      v1::RankStatus* out = r.add_ranks();
      out->set_rank(-1);
      out->set_local_rank(reg.local_slot);
      out->set_node(reg.node);
      out->set_host(reg.host);
      out->set_pid(reg.pid);
      out->set_state(v1::RankStatus::WAITING);
      out->set_incarnation(reg.incarnation);
      out->set_generation(g->number);
    }
  }
  return r;
}

void Coordinator::Notify(RunEntry& run, Deferred& deferred) {
  ++run.revision;
  auto snapshot = std::make_shared<const v1::Run>(Snapshot(run, /*with_ranks=*/true));
  run.observed = snapshot;
  bool done = IsTerminal(run.stored.run.state());
  for (auto& [id, watcher] : run.watchers) {
    WatchCallback cb = watcher.callback;
    deferred.Add([cb, snapshot, done] {
      WatchUpdate update;
      update.event.emplace();
      *update.event->mutable_snapshot() = *snapshot;
      update.done = done;
      cb(update);
    });
  }
  if (done) run.watchers.clear();
  absl::MutexLock lock(&observers_mu_);
  for (RunObserver* o : observers_list_) {
    deferred.Add([o, snapshot] { o->OnRunChanged(*snapshot); });
  }
}

void Coordinator::StopGeneration(RunEntry& run, const absl::Status& cause, Deferred& deferred) {
  Generation& g = *run.gen;
  if (!g.stopped.ok()) return;
  g.stopped = cause;
  stacks_->Complete(run, deferred);  // a capture in progress keeps what arrived; the hang it was for is moot
  if (g.rendezvous_timer != 0) timers_->Cancel(g.rendezvous_timer);
  g.rendezvous.FailAll(cause, deferred);
  g.store->Abort(cause, deferred);
  g.barriers->Abort(cause, deferred);
  checkpoints_->AbortOpenRound(run, cause, deferred);
}

void Coordinator::FailGeneration(RunEntry& run, v1::Failure failure, Deferred& deferred,
                                 std::optional<absl::Status> waiter_status) {
  Generation& g = *run.gen;
  v1::Run& r = run.stored.run;
  if (!g.stopped.ok() || IsTerminal(r.state())) return;  // the first failure is the root cause
  failure.set_generation(g.number);
  *failure.mutable_time() = ToProtoTime(clock_->Now());
  bool exited = failure.kind() == v1::Failure::REPORTED_ERROR || failure.kind() == v1::Failure::PROCESS_EXITED;
  if (exited && failure.rank() >= 0 && !failure.exception_type().empty()) {
    failure.set_before_first_step(BeforeFirstStep(run, failure.rank()));
    MarkRepeatedEarlyFailure(run.failures, failure);
  }
  if (failure.kind() == v1::Failure::HANG) {
    const v1::RunSpec& spec = r.spec();
    MarkRepeatedHang(run.failures, spec.has_max_identical_hangs() ? spec.max_identical_hangs() : 1, failure);
  }
  bool cancelled = failure.kind() == v1::Failure::CANCELLED;
  AddStoppedRanks(run, failure);
  std::vector<std::string> silent;
  if (failure.kind() == v1::Failure::HEARTBEAT_TIMEOUT) silent = SilentNodes(run);
  NextNodes next = ElasticNextNodes(run, silent);
  bool shrinks = next.lost.size() > static_cast<size_t>(r.lost_nodes_size());  // not a kept shape
  if (shrinks && r.restarts() < r.spec().max_restarts()) {
    failure.set_message(absl::StrCat(failure.message(), "; node", next.lost.size() == 1 ? " " : "s ",
                                     absl::StrJoin(next.lost, ", "), " lost: the run goes on with ", next.nodes.size(),
                                     " of its ", r.spec().nodes(), " nodes (at least ", r.spec().min_nodes(), ")"));
    DT_LOG(Warning) << "run " << r.run_id() << ": generation " << g.number + 1 << " forms on " << next.nodes.size()
                    << " of " << r.spec().nodes() << " nodes (" << absl::StrJoin(next.nodes, ", ")
                    << "); lost: " << absl::StrJoin(next.lost, ", ");
  }
  std::string cause = DescribeFailure(failure);
  DT_LOG(Warning) << "run " << r.run_id() << " generation " << g.number << " failed: " << cause;
  if (failure.kind() == v1::Failure::HEARTBEAT_TIMEOUT && stats_ != nullptr) {
    CoordinatorStats* stats = stats_;
    deferred.Add([stats] { stats->CountHeartbeatMiss(); });
  }
  absl::Status status = waiter_status.value_or(absl::AbortedError(
      cancelled ? absl::StrCat("run ", r.run_id(), " was cancelled: ", failure.message())
                : absl::StrCat("generation ", g.number, " of run ", r.run_id(), " failed: ", cause)));
  for (auto& rank : g.ranks) {
    bool culprit = rank.rank() == failure.rank() && !cancelled;
    bool was_stopped = rank.state() == v1::RankStatus::STOPPED;
    if (rank.state() != v1::RankStatus::ACTIVE && !(culprit && was_stopped)) continue;
    rank.set_state(culprit ? v1::RankStatus::FAILED : v1::RankStatus::STOPPED);
  }
  EndGeneration(run, failure, status, deferred);
  if (cancelled) {
    SetState(run, v1::CANCELLED, deferred);
  } else if (failure.fatal()) {
    DT_LOG(Info) << "run " << r.run_id() << ": not restarted (" << r.restarts() << " of " << r.spec().max_restarts()
                 << " restarts spent): restarting cannot help (" << v1::Failure::Kind_Name(failure.kind()) << ")";
    SetState(run, v1::FAILED, deferred);
  } else if (r.restarts() < r.spec().max_restarts()) {
    HandTheJobToNodesThatRemainIfTheBatchHostIsLost(run, silent, /*cancel=*/false);  // before `g` goes
    r.set_restarts(r.restarts() + 1);
    DT_LOG(Info) << "run " << r.run_id() << ": restart " << r.restarts() << " of " << r.spec().max_restarts()
                 << " as generation " << g.number + 1;
    NewGeneration(run, g.number + 1, next);  // destroys `g`
    if (r.state() == v1::RESTARTING) {
      // Already restarting (the next generation failed before it formed): SetState would not
      // save or announce the new generation and the spent restart.
      persistence_->Persist(run, deferred);
      Notify(run, deferred);
    }
    SetState(run, v1::RESTARTING, deferred);
  } else {
    HandTheJobToNodesThatRemainIfTheBatchHostIsLost(run, silent, /*cancel=*/true);
    SetState(run, v1::FAILED, deferred);
  }
}

void Coordinator::EndGeneration(RunEntry& run, const v1::Failure& failure, const absl::Status& status,
                                Deferred& deferred) {
  StopGeneration(run, status, deferred);
  persistence_->PersistRanks(run, deferred);
  RecordFailure(run, failure, deferred);
  run.ended_generations[run.gen->number] = DescribeFailure(failure);
}

void Coordinator::RecordFailure(RunEntry& run, const v1::Failure& failure, Deferred& deferred) {
  v1::Run& r = run.stored.run;
  run.failures.push_back(failure);
  deferred.AddWrite([this, run_id = r.run_id(), failure] {
    if (absl::Status s = db_->AddFailure(run_id, failure); !s.ok()) {
      DT_LOG(Error) << "cannot persist failure of run " << run_id << ": " << s.message();
    }
  });
  *r.mutable_reason() = failure;
}

void Coordinator::RequeueGeneration(RunEntry& run, int signal, Deferred& deferred) {
  Generation& g = *run.gen;
  v1::Run& r = run.stored.run;
  int64_t step = r.step();
  v1::Failure f;
  f.set_kind(g.time_limit ? v1::Failure::TIME_LIMIT : v1::Failure::PREEMPTED);
  f.set_rank(-1);
  f.set_generation(g.number);
  f.set_step(step);
  *f.mutable_time() = ToProtoTime(clock_->Now());
  bool spent = r.preemptions() >= r.spec().max_requeues();
  std::string why = g.time_limit
                        ? absl::StrCat("the job reached its time limit (", SignalName(signal), " ahead of it)")
                        : absl::StrCat("the scheduler asked the job to stop (", SignalName(signal), ": a preemption)");
  std::string saved = step > 0 ? absl::StrCat("every rank checkpointed at step ", step) : "every rank stopped";
  std::string next =
      spent ? absl::StrCat(", but the run's ", r.spec().max_requeues(), " requeue(s) are spent (--max-requeues)")
            : absl::StrCat(" and the job is requeued (requeue ", r.preemptions() + 1, " of ", r.spec().max_requeues(),
                           ")");
  f.set_message(absl::StrCat(why, "; ", saved, next));
  EndGeneration(run, f, absl::AbortedError(absl::StrCat("run ", r.run_id(), " was preempted")), deferred);
  if (spent) {
    SetState(run, v1::FAILED, deferred);
    return;
  }
  r.set_preemptions(r.preemptions() + 1);
  NewGeneration(run, g.number + 1, NextNodes{});  // destroys `g`; a requeued job has its nodes again
  SetState(run, v1::REQUEUED, deferred);
}

void Coordinator::AddStoppedRanks(const RunEntry& run, v1::Failure& failure) const {
  const Generation& g = *run.gen;
  if (!g.health) return;
  std::vector<StoppedRank> victims;
  for (const StoppedRank& s : g.health->StoppedRanks()) {
    if (s.rank == failure.rank()) continue;
    victims.push_back(s);
    failure.add_stopped_ranks(s.rank);
  }
  // A TERMINATED failure's message already tells who was stopped.
  if (!victims.empty() && failure.kind() != v1::Failure::TERMINATED) {
    failure.set_message(absl::StrCat(
        failure.message(), "; stopped by a signal meanwhile (victims, not causes): ", DescribeStopped(run, victims)));
  }
}

absl::StatusOr<Coordinator::Generation*> Coordinator::LiveGeneration(RunEntry& run, int64_t generation, int rank,
                                                                     RankUse use) {
  const v1::Run& r = run.stored.run;
  Generation& g = *run.gen;
  if (generation < g.number) {
    auto it = run.ended_generations.find(generation);
    return absl::AbortedError(absl::StrCat("generation ", generation, " of run ", r.run_id(), " has ended",
                                           it == run.ended_generations.end() ? "" : absl::StrCat(": ", it->second),
                                           "; the run is at generation ", g.number, " (", StateName(r.state()), ")"));
  }
  if (IsTerminal(r.state())) {
    return absl::AbortedError(absl::StrCat("run ", r.run_id(), " has ended ", StateName(r.state()),
                                           r.has_reason() ? absl::StrCat(": ", DescribeFailure(r.reason())) : ""));
  }
  if (generation > g.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", generation, " of run ", r.run_id(), " does not exist (current: ", g.number, ")"));
  }
  if (!g.stopped.ok()) return g.stopped;
  int world = g.rendezvous.world_size();
  bool tool = use == RankUse::kToolAllowed && rank == -1;
  if (!tool && (rank < 0 || rank >= world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside 0..", world - 1, " of run ", r.run_id()));
  }
  return &g;
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

}  // namespace dt
