// Runs: submission, the state machine, failures and restarts, persistence, watchers.
#include "coordinator/coordinator.h"

#include <signal.h>

#include <algorithm>
#include <set>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "common/procs_per_node.h"
#include "common/run_env.h"
#include "common/stop_signals.h"
#include "common/utf8.h"
#include "coordinator/checkpoint_publisher.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/request_checks.h"

namespace dt {
namespace {

constexpr char kRunJsonFile[] = "run.json";
// Runs' file work proceeds in parallel up to this; one run's work is always in order.
constexpr int kFileWorkThreads = 4;

// What a run holds of --max-ranks: its world, or one rank per node while its nodes have not
// counted their processes (--nproc-per-node gpu|cpu|auto; the first count takes the rest).
int64_t RanksToAdmit(int64_t world_size, int32_t nodes) { return std::max<int64_t>(world_size, nodes); }

// How a submission is named when --max-ranks refuses it.
std::string AdmissionName(const v1::RunSpec& spec) {
  return absl::StrCat("run ", Quote(spec.experiment_name()), " (", spec.nodes(), " node(s))");
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, const Clock* clock, TimerQueue* timers, StateDb* db)
    : options_(std::move(options)),
      policy_(DerivePolicy(options_.timeouts)),
      store_budget_(options_.store_bytes_total),
      admission_(options_.max_ranks),
      clock_(clock),
      timers_(timers),
      db_(db),
      file_work_(std::make_unique<FileWorkQueue>(kFileWorkThreads)),
      health_work_(std::make_unique<FileWorkQueue>(1)) {}

Coordinator::~Coordinator() {
  {
    absl::MutexLock lock(&registry_mu_);
    shutting_down_ = true;
    if (health_timer_ != 0) timers_->Cancel(health_timer_);
  }
  health_work_->Drain();
  file_work_->Drain();
}

void Coordinator::AddObserver(RunObserver* observer) {
  absl::MutexLock lock(&observers_mu_);
  observers_list_.push_back(observer);
}

// ---- Auth ----------------------------------------------------------------------------------

std::optional<std::string> Coordinator::RunForTokenDigest(const std::string& token_sha256) const {
  absl::MutexLock lock(&registry_mu_);
  auto it = token_to_run_.find(token_sha256);
  if (it == token_to_run_.end()) return std::nullopt;
  return it->second;
}

absl::Status Coordinator::Authorize(const Principal& who, const std::string& run_id) {
  if (who.admin || who.run_id == run_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("the token of run ", who.run_id, " may not touch run ", run_id,
                                                  "; use that run's token or the admin token"));
}

absl::Status Coordinator::RequireAdmin(const Principal& who, absl::string_view what) {
  if (who.admin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, " needs the admin token; the token given belongs to run ", who.run_id));
}

// ---- Lookup ---------------------------------------------------------------------------------

absl::Status RunEndedError(const v1::Run& r) {
  return absl::FailedPreconditionError(absl::StrCat("run ", r.run_id(), " has ended ", StateName(r.state())));
}

absl::StatusOr<Coordinator::RunPtr> Coordinator::FindRun(const std::string& run_id) const {
  if (absl::Status s = ValidateRunId(run_id); !s.ok()) return s;
  absl::MutexLock lock(&registry_mu_);
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    return absl::NotFoundError(absl::StrCat("run ", run_id, " does not exist (dtctl list shows the runs)"));
  }
  return it->second;
}

std::vector<Coordinator::RunPtr> Coordinator::AllRuns() const {
  absl::MutexLock lock(&registry_mu_);
  std::vector<RunPtr> out;
  out.reserve(runs_.size());
  for (const auto& [id, run] : runs_) out.push_back(run);
  return out;
}

// ---- State machine --------------------------------------------------------------------------

void Coordinator::NewGeneration(RunEntry& run, int64_t number) {
  const v1::RunSpec& spec = run.stored.run.spec();
  auto gen = std::make_unique<Generation>(number, spec.nodes(), spec.procs_per_node());
  std::string run_id = run.stored.run.run_id();
  std::string scope = absl::StrCat("run ", run_id, " generation ", number);
  gen->store = std::make_shared<KvStore>(
      scope, timers_, StoreLimits{options_.max_keys_per_run, options_.store_bytes_per_run, &store_budget_});
  RunEntry* entry = &run;
  // Barrier timeouts arrive on the timer thread: the hook finds the run and takes its lock first.
  gen->barriers = std::make_unique<BarrierTable>(
      scope, WorldSize(spec), clock_, timers_,
      [this, entry](int rank) ABSL_NO_THREAD_SAFETY_ANALYSIS { return DescribeRank(*entry, rank); },
      [this, run_id, number](absl::Time when, const std::string& name, uint64_t sequence) {
        return timers_->Schedule(when, [this, run_id, number, name, sequence] {
          absl::StatusOr<RunPtr> found = FindRun(run_id);
          if (!found.ok()) return;
          RunPtr r = *found;
          LockedRun locked(*r);
          Deferred& deferred = locked.deferred();
          if (r->gen && r->gen->number == number) r->gen->barriers->Expire(name, sequence, deferred);
        });
      },
      options_.max_barrier_names);
  run.gen = std::move(gen);
  run.stored.run.set_generation(number);
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
  std::string detail;
  if (state == v1::RUNNING) {
    detail = absl::StrCat(" (generation ", r.generation(), ", ", r.world_size(), " ranks)");
  } else if (state == v1::RESTARTING || state == v1::REQUEUED || state == v1::FAILED || state == v1::CANCELLED) {
    detail = absl::StrCat(": ", DescribeFailure(r.reason()));
  }
  DT_LOG(Info) << "run " << r.run_id() << " (" << r.spec().experiment_name() << ") " << StateName(old) << " -> "
               << StateName(state) << detail;
  Persist(run, deferred);
  Notify(run, deferred);
}

void Coordinator::Persist(RunEntry& run, Deferred& deferred) {
  *run.stored.run.mutable_updated_at() = ToProtoTime(clock_->Now());
  deferred.AddWrite([this, entry = run.shared_from_this(), sequence = ++run.persist_sequence, stored = run.stored] {
    WriteRecord(*entry, sequence, stored);
  });
}

void Coordinator::TakeRankProgress(RunEntry& run) {
  Generation& g = *run.gen;
  if (g.health) {
    for (auto& r : g.ranks) {
      r.set_step(g.health->step(r.rank()));
      *r.mutable_last_heartbeat() = ToProtoTime(g.health->last_heartbeat(r.rank()));
    }
  }
  g.rows_dirty = false;
}

void Coordinator::MarkProgressTaken(RunEntry& run) {
  Generation& g = *run.gen;
  if (g.health) run.stored.run.set_step(g.health->group_step());
  g.ranks_dirty = false;
  g.last_flush = clock_->Now();
}

void Coordinator::PersistRanks(RunEntry& run, Deferred& deferred) {
  if (!run.gen) return;
  TakeRankProgress(run);
  MarkProgressTaken(run);
  deferred.AddWrite([this, entry = run.shared_from_this(), sequence = ++run.persist_sequence,
                     run_id = run.stored.run.run_id(),
                     ranks = run.gen->ranks] { WriteRanks(*entry, sequence, run_id, ranks); });
}

v1::RankProgress Coordinator::ProgressRecord(const Generation& g) {
  v1::RankProgress out;
  out.set_generation(g.number);
  const int n = static_cast<int>(g.ranks.size());
  out.mutable_steps()->Reserve(n);
  out.mutable_last_heartbeat_unix_ms()->Reserve(n);
  out.mutable_pids()->Reserve(n);
  out.mutable_idle_ms()->Reserve(n);
  for (const v1::RankStatus& r : g.ranks) {
    out.add_steps(g.health ? g.health->step(r.rank()) : r.step());
    out.add_last_heartbeat_unix_ms(
        absl::ToUnixMillis(g.health ? g.health->last_heartbeat(r.rank()) : FromProtoTime(r.last_heartbeat())));
    out.add_pids(r.pid());
    out.add_idle_ms(r.idle_ms());
  }
  return out;
}

void Coordinator::FlushProgress(const RunPtr& run) {
  // One record for every rank (packed numbers), not a row per rank: at 100,000 ranks a flush
  // every 2 s of rank rows would keep a core busy.
  bool task_waiting = run->unwritten_progress != nullptr;
  std::optional<std::vector<v1::RankStatus>> rows;
  // A rank finished, was stopped or reported its pre-flight (now, or in a snapshot no task has
  // taken yet): the rows are written too, as they are now, so a coordinator killed before the
  // generation ends does not bring such a rank back active.
  if (run->gen->rows_dirty || (task_waiting && run->unwritten_progress->rows)) {
    TakeRankProgress(*run);
    rows = run->gen->ranks;
  }
  v1::RankProgress progress = ProgressRecord(*run->gen);
  MarkProgressTaken(*run);
  *run->stored.run.mutable_updated_at() = ToProtoTime(clock_->Now());
  run->unwritten_progress = std::make_shared<ProgressSnapshot>(
      ProgressSnapshot{++run->persist_sequence, run->stored, std::move(progress), std::move(rows)});
  if (task_waiting) return;
  file_work_->Post(run->stored.run.run_id(), [this, run] {
    std::shared_ptr<ProgressSnapshot> snapshot;
    {
      RunMutexLock lock(&run->mu);
      snapshot.swap(run->unwritten_progress);
    }
    if (snapshot->rows) WriteRanks(*run, snapshot->sequence, snapshot->stored.run.run_id(), *snapshot->rows);
    WriteProgress(*run, snapshot->sequence, snapshot->stored.run.run_id(), snapshot->progress);
    WriteRecord(*run, snapshot->sequence, snapshot->stored);
  });
}

void Coordinator::WriteProgress(RunEntry& run, uint64_t sequence, const std::string& run_id,
                                const v1::RankProgress& progress) {
  absl::MutexLock lock(&run.persist_mu);
  if (sequence <= run.progress_written) return;
  if (absl::Status s = db_->SaveRankProgress(run_id, progress); !s.ok()) {
    DT_LOG(Error) << "cannot persist the progress of run " << run_id << ": " << s.message();
    return;
  }
  run.progress_written = sequence;
}

void Coordinator::WriteRecord(RunEntry& run, uint64_t sequence, const StoredRun& stored) {
  absl::MutexLock lock(&run.persist_mu);
  if (sequence <= run.record_written) return;
  if (absl::Status s = db_->SaveRun(stored); !s.ok()) {
    DT_LOG(Error) << "cannot persist run " << stored.run.run_id() << ": " << s.message();
    return;
  }
  run.record_written = sequence;
}

void Coordinator::WriteRanks(RunEntry& run, uint64_t sequence, const std::string& run_id,
                             const std::vector<v1::RankStatus>& ranks) {
  absl::MutexLock lock(&run.persist_mu);
  if (sequence <= run.ranks_written) return;
  if (absl::Status s = db_->SaveRanks(run_id, ranks); !s.ok()) {
    DT_LOG(Error) << "cannot persist ranks of run " << run_id << ": " << s.message();
    return;
  }
  run.ranks_written = sequence;
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
  if (g.capture) CompleteCapture(run, deferred);  // what arrived is kept; the hang it was for is moot
  if (g.rendezvous_timer != 0) timers_->Cancel(g.rendezvous_timer);
  g.rendezvous.FailAll(cause, deferred);
  g.store->Abort(cause, deferred);
  g.barriers->Abort(cause, deferred);
  if (g.round && g.round->state == CheckpointRound::State::kOpen) {
    AbortRound(run, *g.round, cause, deferred);
  }
}

void Coordinator::FailGeneration(RunEntry& run, v1::Failure failure, Deferred& deferred,
                                 std::optional<absl::Status> waiter_status) {
  Generation& g = *run.gen;
  v1::Run& r = run.stored.run;
  if (!g.stopped.ok() || IsTerminal(r.state())) return;  // the first failure is the root cause
  failure.set_generation(g.number);
  *failure.mutable_time() = ToProtoTime(clock_->Now());
  if (failure.kind() == v1::Failure::REPORTED_ERROR || failure.kind() == v1::Failure::PROCESS_EXITED) {
    CheckRepeatedEarlyFailure(run, failure);
  }
  if (failure.kind() == v1::Failure::HANG) CheckRepeatedHang(run, failure);
  bool cancelled = failure.kind() == v1::Failure::CANCELLED;
  AddStoppedRanks(run, failure);
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
    r.set_restarts(r.restarts() + 1);
    DT_LOG(Info) << "run " << r.run_id() << ": restart " << r.restarts() << " of " << r.spec().max_restarts()
                 << " as generation " << g.number + 1;
    NewGeneration(run, g.number + 1);  // destroys `g`
    if (r.state() == v1::RESTARTING) {
      // Already restarting (the next generation failed before it formed): SetState would not
      // save or announce the new generation and the spent restart.
      Persist(run, deferred);
      Notify(run, deferred);
    }
    SetState(run, v1::RESTARTING, deferred);
  } else {
    SetState(run, v1::FAILED, deferred);
  }
}

void Coordinator::EndGeneration(RunEntry& run, const v1::Failure& failure, const absl::Status& status,
                                Deferred& deferred) {
  StopGeneration(run, status, deferred);
  PersistRanks(run, deferred);
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
  NewGeneration(run, g.number + 1);  // destroys `g`
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
  int world = WorldSize(r.spec());
  bool tool = use == RankUse::kToolAllowed && rank == -1;
  if (!tool && (rank < 0 || rank >= world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside 0..", world - 1, " of run ", r.run_id()));
  }
  return &g;
}

std::function<void()> Coordinator::RunJsonWriter(const RunEntry& run) const {
  const v1::Run& r = run.stored.run;
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(r.spec(), &spec_json, options);
  nlohmann::json doc;
  doc["run_id"] = r.run_id();
  doc["spec"] = nlohmann::json::parse(spec_json, nullptr, false);
  doc["world_size"] = WorldSize(r.spec());
  doc["generation"] = r.generation();
  doc["restarts"] = r.restarts();
  doc["created_at"] = absl::FormatTime(absl::RFC3339_sec, FromProtoTime(r.created_at()), absl::UTCTimeZone());
  doc["resumed_from_step"] = r.resumed_from_step();
  doc["coordinator_version"] = options_.version;
  nlohmann::json hosts = nlohmann::json::array();
  std::set<std::string> versions;
  if (run.gen && run.gen->assigned) {
    for (const auto& rank : run.gen->ranks) {
      hosts.push_back({{"rank", rank.rank()},
                       {"node", rank.node()},
                       {"host", rank.host()},
                       {"local_rank", rank.local_rank()},
                       {"pid", rank.pid()}});
    }
  }
  doc["ranks"] = hosts;
  return [hook = options_.before_file_work, run_id = r.run_id(), exp_dir = r.exp_dir(), identity = r.exp_dir_identity(),
          text = doc.dump(2) + "\n"] {
    if (hook) hook(exp_dir);
    absl::StatusOr<DirFd> exp = OpenExperimentDir(exp_dir, identity);
    absl::Status written = exp.ok() ? exp->WriteFileAtomic(kRunJsonFile, text) : exp.status();
    if (!written.ok()) {
      DT_LOG(Warning) << "run " << run_id << ": cannot write " << kRunJsonFile << ": " << written.message();
    }
  };
}

void Coordinator::WriteRunJson(const RunEntry& run) const {
  file_work_->Post(run.stored.run.run_id(), RunJsonWriter(run));
}

// ---- Runs -----------------------------------------------------------------------------------

namespace {

absl::Status ValidateSpec(const v1::RunSpec& spec) {
  if (absl::Status s = ValidateExperimentName(spec.experiment_name()); !s.ok()) return s;
  if (absl::Status s = ValidateAbsolutePath("save dir", spec.save_dir()); !s.ok()) return s;
  if (spec.nodes() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nodes must be at least 1, not ", spec.nodes()));
  }
  if (absl::Status s = ValidateProcsPerNodeRule(spec.procs_per_node_rule()); !s.ok()) return s;
  bool counted_on_nodes = spec.procs_per_node() == 0 && !spec.procs_per_node_rule().empty();
  if (counted_on_nodes && spec.exec_command_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("processes per node ", Quote(spec.procs_per_node_rule()),
                     " can be counted on the nodes only by dtrun (an --exec run); a dttrainer run takes a count"));
  }
  if (!counted_on_nodes && spec.procs_per_node() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("procs per node must be at least 1, not ", spec.procs_per_node()));
  }
  int64_t world = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node();
  if (world > kMaxWorldSize) {
    return absl::ResourceExhaustedError(absl::StrCat("world size ", spec.nodes(), " × ", spec.procs_per_node(), " = ",
                                                     world, " exceeds the limit of ", kMaxWorldSize));
  }
  if (spec.max_requeues() < 0 || spec.max_requeues() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("max requeues must be within 0..1000, not ", spec.max_requeues()));
  }
  if (spec.max_restarts() < 0 || spec.max_restarts() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("max restarts must be within 0..1000, not ", spec.max_restarts()));
  }
  if (spec.has_idle_timeout_ms() &&
      (spec.idle_timeout_ms() < 0 || spec.idle_timeout_ms() > absl::ToInt64Milliseconds(kMaxIdleTimeout))) {
    return absl::InvalidArgumentError(absl::StrCat("idle timeout must be within 0 (off) and ",
                                                   absl::FormatDuration(kMaxIdleTimeout), ", not ",
                                                   spec.idle_timeout_ms(), " ms"));
  }
  if (spec.has_max_identical_hangs() && (spec.max_identical_hangs() < 1 || spec.max_identical_hangs() > 1000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max identical hangs must be within 1..1000, not ", spec.max_identical_hangs()));
  }
  if (spec.keep_checkpoints() < 0 || spec.keep_checkpoints() > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep checkpoints must be within 0..1000, not ", spec.keep_checkpoints()));
  }
  if (static_cast<size_t>(spec.trainer_args_size()) > kMaxTrainerArgs) {
    return absl::InvalidArgumentError(
        absl::StrCat("", spec.trainer_args_size(), " trainer arguments exceed the limit of ", kMaxTrainerArgs));
  }
  for (const auto& arg : spec.trainer_args()) {
    if (arg.size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer argument ", Quote(arg), " is longer than ", kMaxPathBytes, " bytes"));
    }
  }
  if (static_cast<size_t>(spec.exec_command_size()) > kMaxTrainerArgs) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.exec_command_size(), " words in the --exec command exceed the limit of ", kMaxTrainerArgs));
  }
  if (spec.exec_command_size() > 0 && spec.exec_command(0).empty()) {
    return absl::InvalidArgumentError("the --exec command's program is empty");
  }
  for (const auto& arg : spec.exec_command()) {
    if (arg.size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("--exec command word ", Quote(arg), " is longer than ", kMaxPathBytes, " bytes"));
    }
  }
  for (const auto& arg : spec.sbatch_args()) {
    if (arg.size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat("sbatch argument ", Quote(arg), " is too long"));
    }
  }
  if (absl::Status s = ValidateRunEnv(spec.env()); !s.ok()) return s;
  if (!spec.wandb().base_url().empty()) {
    return absl::InvalidArgumentError(
        "a run cannot choose the W&B server: the coordinator's API key goes only where its operator points it "
        "(dtcoord's WANDB_BASE_URL); leave wandb.base_url empty");
  }
  const std::string& mode = spec.wandb().mode();
  if (!mode.empty() && mode != "online" && mode != "offline" && mode != "disabled") {
    return absl::InvalidArgumentError(
        absl::StrCat("W&B mode ", Quote(mode), " is not one of online, offline, disabled"));
  }
  if (!spec.join_key().empty()) {
    if (absl::Status s = ValidateLabel("join key", spec.join_key()); !s.ok()) return s;
  }
  if (!spec.trainer_path().empty()) {
    if (absl::Status s = ValidateAbsolutePath("trainer path", spec.trainer_path()); !s.ok()) return s;
  }
  if (spec.labels_size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("a run has at most ", kMaxLabels, " labels, not ", spec.labels_size()));
  }
  for (const auto& [k, v] : spec.labels()) {
    if (absl::Status s = ValidateLabel("label name", k); !s.ok()) return s;
    if (v.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", Quote(k), " is ", v.size(),
                                                     " bytes long; a label's value has at most ", kMaxLabelValueBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Coordinator::CheckExperimentDirFree(const ExperimentDir& dir) {
  if (submitting_dirs_.count(dir.path) > 0 ||
      submitting_inodes_.count({dir.identity.device(), dir.identity.inode()}) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("another submission of experiment directory ", dir.path,
                                                 " is in progress; wait for it or choose another --name"));
  }
  std::set<std::string> holders;
  auto [first, last] = exp_dir_runs_.equal_range(dir.path);
  for (auto it = first; it != last; ++it) holders.insert(it->second);
  auto [ifirst, ilast] = exp_dir_inodes_.equal_range({dir.identity.device(), dir.identity.inode()});
  for (auto it = ifirst; it != ilast; ++it) holders.insert(it->second);
  for (const std::string& id : holders) {
    RunPtr other = runs_.at(id);
    RunMutexLock lock(&other->mu);
    const v1::Run& o = other->stored.run;
    if (IsTerminal(o.state())) continue;
    std::string spelling = o.exp_dir() == dir.path ? "" : absl::StrCat(" (as ", o.exp_dir(), ")");
    return absl::AlreadyExistsError(absl::StrCat("run ", id, " (", StateName(o.state()),
                                                 ") already uses experiment directory ", dir.path, spelling,
                                                 "; cancel it (dtctl cancel ", id, ") or choose another --name"));
  }
  return absl::OkStatus();
}

void Coordinator::IndexExperimentDir(const v1::Run& r) {
  exp_dir_runs_.emplace(r.exp_dir(), r.run_id());
  if (r.has_exp_dir_identity()) {
    exp_dir_inodes_.emplace(std::make_pair(r.exp_dir_identity().device(), r.exp_dir_identity().inode()), r.run_id());
  }
}

std::optional<v1::SubmitRunResponse> Coordinator::JoinSubmittedRun(const std::string& join_key) {
  if (join_key.empty()) return std::nullopt;
  auto joined = join_keys_.find(join_key);
  if (joined == join_keys_.end()) return std::nullopt;
  RunPtr run = runs_.at(joined->second);
  RunMutexLock lock(&run->mu);
  const v1::Run& r = run->stored.run;
  if (IsTerminal(r.state())) return std::nullopt;
  v1::SubmitRunResponse out;
  out.set_run_id(r.run_id());
  out.set_exp_dir(r.exp_dir());
  out.set_resume_step(r.resumed_from_step());
  out.set_joined(true);
  return out;  // no run token: the caller's own token already may act on the run
}

absl::StatusOr<Coordinator::Submission> Coordinator::AdmitSubmission(const v1::RunSpec& spec) {
  absl::MutexLock registry(&registry_mu_);
  if (!spec.join_key().empty()) {
    // A submission of the same join key is making its files: wait for it, then join its run.
    const std::string& key = spec.join_key();
    auto free = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu_) -> bool {
      return submitting_join_keys_.count(key) == 0;
    };
    registry_mu_.Await(absl::Condition(&free));
  }
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
  if (std::optional<v1::SubmitRunResponse> joined = JoinSubmittedRun(spec.join_key())) return Submission{*joined};
  Submission admitted;
  admitted.ranks = RanksToAdmit(WorldSize(spec), spec.nodes());
  if (absl::Status s = admission_.Admit(admitted.ranks, AdmissionName(spec)); !s.ok()) return s;
  if (!spec.join_key().empty()) submitting_join_keys_.insert(spec.join_key());
  return admitted;
}

void Coordinator::WithdrawSubmission(const v1::RunSpec& spec, int64_t ranks) {
  admission_.Release(ranks);
  submitting_join_keys_.erase(spec.join_key());
}

absl::StatusOr<std::string> Coordinator::ReserveSubmission(const ExperimentDir& dir) {
  if (absl::Status s = CheckExperimentDirFree(dir); !s.ok()) return s;
  std::string run_id;
  // Unique among the runs in memory and those being submitted (64 random bits: a clash is a bug).
  do {
    run_id = absl::StrCat("r-", RandomHex(8));
  } while (runs_.contains(run_id) || submitting_ids_.count(run_id) > 0);
  submitting_ids_.insert(run_id);
  submitting_dirs_.insert(dir.path);
  submitting_inodes_.insert({dir.identity.device(), dir.identity.inode()});
  return run_id;
}

void Coordinator::ReleaseSubmission(const v1::RunSpec& spec, const ExperimentDir& dir, const std::string& run_id) {
  submitting_ids_.erase(run_id);
  submitting_dirs_.erase(dir.path);
  submitting_inodes_.erase({dir.identity.device(), dir.identity.inode()});
  submitting_join_keys_.erase(spec.join_key());
}

// Phases, so that no lock is held across the file system or the database: the registry admits
// the run's ranks (and holds its join key), the directory is resolved, the registry reserves it,
// the files and the record are made off every lock, and the registry then publishes the run.
absl::StatusOr<v1::SubmitRunResponse> Coordinator::SubmitRun(const v1::RunSpec& request_spec) {
  if (absl::Status s = ValidateSpec(request_spec); !s.ok()) return s;
  v1::RunSpec spec = request_spec;
  if (spec.scheduler() == v1::SCHEDULER_UNSPECIFIED) spec.set_scheduler(v1::LOCAL);
  if (spec.log_strategy() == v1::LOG_STRATEGY_UNSPECIFIED) spec.set_log_strategy(v1::MAIN);
  if (spec.keep_checkpoints() == 0) spec.set_keep_checkpoints(3);
  // Before the directory is made: a submission past --max-ranks makes nothing.
  absl::StatusOr<Submission> admitted = AdmitSubmission(spec);
  if (!admitted.ok()) return admitted.status();
  if (admitted->joined) return *admitted->joined;
  // Creating the directory is harmless; nothing inside it is touched before the check below.
  absl::StatusOr<ExperimentDir> dir = ResolveExperimentDir(spec.save_dir(), spec.experiment_name());
  absl::StatusOr<std::string> run_id = absl::UnknownError("not reserved");
  {
    absl::MutexLock registry(&registry_mu_);
    run_id = dir.ok() ? ReserveSubmission(*dir) : absl::StatusOr<std::string>(dir.status());
    if (!run_id.ok()) {
      WithdrawSubmission(spec, admitted->ranks);
      return run_id.status();
    }
  }

  std::string token = absl::StrCat("dt_run_", RandomHex(24));
  absl::StatusOr<RunPtr> made = MakeRunEntry(spec, *dir, *run_id, token);
  Deferred deferred;
  absl::MutexLock registry(&registry_mu_);
  ReleaseSubmission(spec, *dir, *run_id);
  if (!made.ok()) {
    admission_.Release(admitted->ranks);
    return made.status();
  }
  RunPtr run = *made;
  // Published even while shutting down: its record is written, and the replacement loads it.
  RunMutexLock lock(&run->mu);
  run->ranks_admitted = admitted->ranks;
  const v1::Run& r = run->stored.run;
  runs_.emplace(r.run_id(), run);
  token_to_run_.emplace(run->stored.token_sha256, r.run_id());
  IndexExperimentDir(r);
  if (!spec.join_key().empty()) join_keys_[spec.join_key()] = r.run_id();
  DT_LOG(Info) << "run " << r.run_id() << " (" << spec.experiment_name() << ") submitted: " << spec.nodes()
               << " node(s) x " << spec.procs_per_node() << ", " << v1::Scheduler_Name(spec.scheduler()) << ", exp dir "
               << dir->path << (dir->resume ? absl::StrCat(", resuming from step ", dir->resume->step()) : "");
  Notify(*run, deferred);

  v1::SubmitRunResponse out;
  out.set_run_id(r.run_id());
  out.set_run_token(token);
  out.set_exp_dir(dir->path);
  out.set_resume_step(r.resumed_from_step());
  return out;
}

absl::StatusOr<Coordinator::RunPtr> Coordinator::MakeRunEntry(const v1::RunSpec& spec, ExperimentDir& dir,
                                                              const std::string& run_id, const std::string& token) {
  if (options_.before_file_work) options_.before_file_work(dir.path);
  if (absl::Status s = PrepareExperimentDir(dir); !s.ok()) return s;
  auto run = std::make_shared<RunEntry>();
  std::function<void()> write_run_json;
  StoredRun stored;
  uint64_t sequence = 0;
  {
    RunMutexLock lock(&run->mu);
    v1::Run& r = run->stored.run;
    r.set_run_id(run_id);
    *r.mutable_spec() = spec;
    r.set_state(v1::PENDING);
    r.set_world_size(WorldSize(spec));
    r.set_exp_dir(dir.path);
    *r.mutable_exp_dir_identity() = dir.identity;
    r.set_latest_checkpoint_step(dir.resume ? dir.resume->step() : -1);
    r.set_resumed_from_step(dir.resume ? dir.resume->step() : 0);
    *r.mutable_created_at() = ToProtoTime(clock_->Now());
    *r.mutable_updated_at() = r.created_at();
    run->stored.token_sha256 = Sha256Hex(token);
    run->stored.join_key = spec.join_key();
    run->stored.resume_from = dir.resume;
    NewGeneration(*run, 0);
    stored = run->stored;
    sequence = ++run->persist_sequence;
    write_run_json = RunJsonWriter(*run);
  }
  WriteRecord(*run, sequence, stored);
  write_run_json();
  return run;
}

absl::StatusOr<v1::Run> Coordinator::GetRun(const std::string& run_id) {
  absl::StatusOr<RunPtr> run = FindRun(run_id);
  if (!run.ok()) return run.status();
  RunMutexLock lock(&(*run)->mu);
  return Snapshot(**run, /*with_ranks=*/true);
}

namespace {

// A run's place in ListRuns' order (newest first, then by id), as a page token: "<ns>.<run id>".
std::string PageToken(const v1::Run& r) {
  return absl::StrCat(absl::ToUnixNanos(FromProtoTime(r.created_at())), ".", r.run_id());
}

bool ListedBefore(const v1::Run& a, const v1::Run& b) {
  absl::Time ta = FromProtoTime(a.created_at()), tb = FromProtoTime(b.created_at());
  if (ta != tb) return ta > tb;
  return a.run_id() < b.run_id();
}

}  // namespace

absl::StatusOr<Coordinator::RunPage> Coordinator::ListRuns(int limit, const std::vector<v1::RunState>& states,
                                                           const std::string& page_token) {
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("limit must not be negative, not ", limit));
  std::optional<v1::Run> after;  // the last run of the previous page
  if (!page_token.empty()) {
    std::vector<std::string> parts = absl::StrSplit(page_token, absl::MaxSplits('.', 1));
    int64_t ns = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &ns) || !ValidateRunId(parts[1]).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("page token ", Quote(page_token), " is not one ListRuns returned (pass next_page_token as is)"));
    }
    after.emplace();
    *after->mutable_created_at() = ToProtoTime(absl::FromUnixNanos(ns));
    after->set_run_id(parts[1]);
  }
  std::vector<v1::Run> all;
  for (const RunPtr& run : AllRuns()) {
    RunMutexLock lock(&run->mu);
    const v1::Run& r = run->stored.run;
    if (!states.empty() && std::find(states.begin(), states.end(), r.state()) == states.end()) continue;
    if (after && !ListedBefore(*after, r)) continue;
    all.push_back(Snapshot(*run, /*with_ranks=*/false));
  }
  std::sort(all.begin(), all.end(), ListedBefore);
  RunPage page;
  size_t bytes = 0;
  for (v1::Run& r : all) {
    if (limit > 0 && static_cast<int>(page.runs.size()) == limit) break;
    size_t size = r.ByteSizeLong();
    if (!page.runs.empty() && bytes + size > kMaxListRunsPageBytes) {
      page.next_page_token = PageToken(page.runs.back());
      break;
    }
    bytes += size;
    page.runs.push_back(std::move(r));
  }
  if (limit > 0 && static_cast<int>(page.runs.size()) == limit && all.size() > page.runs.size()) {
    page.next_page_token = PageToken(page.runs.back());
  }
  return page;
}

absl::StatusOr<v1::Run> Coordinator::CancelRun(const std::string& run_id, const std::string& reason) {
  if (absl::Status s = ValidateCancelReason(reason); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(run_id);
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  if (!IsTerminal(run->stored.run.state())) {
    v1::Failure failure;
    failure.set_kind(v1::Failure::CANCELLED);
    failure.set_rank(-1);
    failure.set_message(reason.empty() ? "cancelled by a user" : reason);
    FailGeneration(*run, failure, deferred);
  }
  return Snapshot(*run, /*with_ranks=*/true);
}

absl::StatusOr<v1::Run> Coordinator::AttachLaunch(const v1::AttachLaunchRequest& request) {
  if (absl::Status s = ValidateAttachLaunchRequest(request); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  // The admin's dtctl passes this id to scancel/squeue: only the scheduler's own form is taken.
  absl::Status id_ok = r.spec().scheduler() == v1::SLURM ? ValidateSlurmJobId(request.scheduler_job_id())
                                                         : ValidateLocalJobId(request.scheduler_job_id());
  if (!id_ok.ok()) return id_ok;
  if (IsTerminal(r.state())) return RunEndedError(r);
  r.set_scheduler_job_id(request.scheduler_job_id());
  r.set_launcher_host(request.launcher_host());
  Persist(*run, deferred);
  Notify(*run, deferred);
  return Snapshot(*run, /*with_ranks=*/true);
}

std::vector<std::string> Coordinator::AddExcludedNodes(RunEntry& run, const std::vector<std::string>& nodes) {
  v1::Run& r = run.stored.run;
  std::vector<std::string> added;
  for (const std::string& node : nodes) {
    if (r.excluded_nodes_size() >= kMaxExcludedNodes) break;
    if (absl::c_linear_search(r.excluded_nodes(), node)) continue;
    r.add_excluded_nodes(node);
    added.push_back(node);
  }
  return added;
}

absl::StatusOr<v1::Run> Coordinator::ExcludeNodes(const v1::ExcludeNodesRequest& request) {
  if (absl::Status s = ValidateExcludeNodesRequest(request); !s.ok()) return s;
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  if (IsTerminal(r.state())) return RunEndedError(r);
  std::vector<const v1::FailedNode*> added;
  for (const v1::FailedNode& n : request.nodes()) {
    bool known = absl::c_linear_search(r.excluded_nodes(), n.node()) ||
                 absl::c_any_of(added, [&](const v1::FailedNode* a) { return a->node() == n.node(); });
    if (!known) added.push_back(&n);
  }
  if (r.excluded_nodes_size() + static_cast<int>(added.size()) > kMaxExcludedNodes) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", r.run_id(), " would exclude more than ", kMaxExcludedNodes, " nodes"));
  }
  for (const v1::FailedNode* n : added) {
    AddExcludedNodes(*run, {n->node()});
    v1::Failure f;
    f.set_kind(v1::Failure::NODE_FAILED);
    f.set_rank(-1);
    f.set_node(n->node());
    f.set_generation(run->gen ? run->gen->number : r.generation());
    f.set_step(r.step());
    *f.mutable_time() = ToProtoTime(clock_->Now());
    f.set_message(absl::StrCat("node ", n->node(), " failed",
                               n->evidence().empty() ? "" : absl::StrCat(" (", n->evidence(), ")"),
                               "; it is excluded from the job, which runs again on other nodes"));
    DT_LOG(Warning) << "run " << r.run_id() << ": " << f.message();
    RecordFailure(*run, f, deferred);
  }
  if (!added.empty()) {
    Persist(*run, deferred);
    Notify(*run, deferred);
  }
  return Snapshot(*run, /*with_ranks=*/true);
}

absl::StatusOr<v1::Experiment> Coordinator::GetExperiment(const std::string& run_id) {
  absl::StatusOr<RunPtr> found = FindRun(run_id);
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  v1::Experiment out;
  std::string exp_dir;
  v1::ExperimentDirIdentity identity;
  {
    RunMutexLock lock(&run->mu);
    const v1::Run& r = run->stored.run;
    ExperimentDir paths = ExperimentPaths(r.exp_dir());
    out.set_run_id(r.run_id());
    out.set_exp_dir(paths.path);
    out.set_logs_dir(paths.logs_dir);
    out.set_checkpoints_dir(paths.checkpoints_dir);
    out.set_created_by_this_run(!run->stored.resume_from.has_value() && r.resumed_from_step() == 0);
    if (std::optional<v1::CheckpointInfo> latest = Latest(*run)) *out.mutable_resume() = *latest;
    exp_dir = r.exp_dir();
    identity = r.exp_dir_identity();
  }
  // run.json is read off the run's lock: a slow save dir delays only this call.
  absl::StatusOr<DirFd> exp = OpenExperimentDir(exp_dir, identity);
  if (!exp.ok()) return exp.status();
  absl::StatusOr<std::string> json = exp->ReadFile(kRunJsonFile, kMaxRunJsonBytes);
  if (json.ok()) out.set_run_json(*json);
  return out;
}

Coordinator::Census Coordinator::TakeCensus() const {
  Census c;
  for (const RunPtr& run : AllRuns()) {
    RunMutexLock lock(&run->mu);
    const v1::Run& r = run->stored.run;
    ++c.runs_by_state[r.state()];
    if (!IsTerminal(r.state()) && run->gen && run->gen->assigned) {
      for (const auto& rank : run->gen->ranks) c.registered_ranks += rank.state() == v1::RankStatus::ACTIVE;
    }
  }
  c.metric_batches_unstored = MetricBatchesUnstored();
  c.admitted_ranks = admission_.admitted();
  return c;
}

// ---- Watch ----------------------------------------------------------------------------------

absl::StatusOr<uint64_t> Coordinator::Watch(const std::string& run_id, bool include_metrics, WatchCallback callback) {
  absl::StatusOr<RunPtr> found = FindRun(run_id);
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  Deferred deferred;
  // Registry, then run: Shutdown cannot clear the watchers between the check and the insert.
  absl::MutexLock registry(&registry_mu_);
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
  uint64_t id = next_watch_id_++;
  RunMutexLock lock(&run->mu);
  WatchUpdate first;
  first.event.emplace();
  *first.event->mutable_snapshot() = Snapshot(*run, /*with_ranks=*/true);
  first.done = IsTerminal(run->stored.run.state());
  deferred.Add([callback, first] { callback(first); });
  if (!first.done) run->watchers.emplace(id, RunEntry::Watcher{include_metrics, std::move(callback)});
  return id;
}

void Coordinator::Unwatch(const std::string& run_id, uint64_t watch_id) {
  absl::StatusOr<RunPtr> found = FindRun(run_id);
  if (!found.ok()) return;
  RunMutexLock lock(&(*found)->mu);
  (*found)->watchers.erase(watch_id);
}

// ---- Start-up and shutdown ------------------------------------------------------------------

absl::Status Coordinator::Load() {
  absl::StatusOr<std::vector<LoadedRun>> loaded = db_->LoadRuns();
  if (!loaded.ok()) return loaded.status();
  int active = 0;
  absl::Time now = clock_->Now();
  absl::MutexLock registry(&registry_mu_);
  for (LoadedRun& l : *loaded) {
    auto run = std::make_shared<RunEntry>();
    RunMutexLock lock(&run->mu);
    run->stored = std::move(l.stored);
    run->failures = std::move(l.failures);
    run->checkpoints = std::move(l.checkpoints);
    for (const auto& f : run->failures) {
      run->ended_generations[f.generation()] = DescribeFailure(f);
    }
    v1::Run& r = run->stored.run;
    NewGeneration(*run, r.generation());
    if (!IsTerminal(r.state())) {
      ++active;
      run->ranks_admitted = RanksToAdmit(r.world_size(), r.spec().nodes());
      admission_.Readmit(run->ranks_admitted);
      Generation& g = *run->gen;
      bool complete = static_cast<int>(l.ranks.size()) == r.world_size();
      for (const auto& rank : l.ranks) complete = complete && rank.generation() == g.number;
      if (r.state() == v1::RUNNING && complete) {
        g.assigned = true;
        g.ranks = l.ranks;
        int64_t start = run->checkpoints.empty() ? r.resumed_from_step() : run->checkpoints.back().step();
        g.health = std::make_unique<HealthTracker>(r.world_size(), start, now,
                                                   /*steps_expected=*/r.spec().exec_command().empty());
        for (const auto& rank : g.ranks) {
          g.health->Heartbeat(rank.rank(), rank.step(), now);
          if (rank.state() == v1::RankStatus::FINISHED) g.health->Finish(rank.rank(), clock_->Now());
          // The signal is not persisted; the stop is (a victim stays a victim across a restart).
          if (rank.state() == v1::RankStatus::STOPPED) g.health->Stop(rank.rank(), SIGTERM, now);
        }
        g.health->GraceAll(now);
      } else if (r.state() == v1::RUNNING || r.state() == v1::RENDEZVOUS) {
        // The registrations were in flight: trainers retry them against this generation.
        r.set_state(v1::RENDEZVOUS);
      }
      absl::StatusOr<DirFd> checkpoints = OpenCheckpointsDir(r.exp_dir(), r.exp_dir_identity());
      absl::StatusOr<int> removed =
          checkpoints.ok() ? RemovePartials(*checkpoints) : absl::StatusOr<int>(checkpoints.status());
      if (!removed.ok()) {
        DT_LOG(Warning) << "run " << r.run_id() << ": " << removed.status().message();
      } else if (*removed > 0) {
        DT_LOG(Info) << "run " << r.run_id() << ": removed " << *removed
                     << " partial checkpoint directories left by the previous coordinator";
      }
    }
    run->observed = std::make_shared<const v1::Run>(Snapshot(*run, true));
    std::string id = r.run_id();
    token_to_run_.emplace(run->stored.token_sha256, id);
    IndexExperimentDir(r);
    if (!run->stored.join_key.empty()) join_keys_[run->stored.join_key] = id;
    runs_.emplace(id, std::move(run));
  }
  DT_LOG(Info) << "loaded " << loaded->size() << " runs from the state database (" << active << " active)";
  return absl::OkStatus();
}

void Coordinator::Start() { ScheduleHealthCheck(); }

void Coordinator::ScheduleHealthCheck() {
  absl::MutexLock lock(&registry_mu_);
  if (shutting_down_) return;
  health_timer_ = timers_->Schedule(clock_->Now() + options_.health_check_period, [this] {
    health_work_->Post("health check", [this] {
      CheckHealth();
      ScheduleHealthCheck();
    });
  });
}

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&registry_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    if (health_timer_ != 0) timers_->Cancel(health_timer_);
  }
  absl::Status unavailable = absl::UnavailableError("the coordinator is shutting down; retry against its replacement");
  for (const RunPtr& run : AllRuns()) {
    LockedRun locked(*run);
    Deferred& deferred = locked.deferred();
    if (run->gen) {
      Generation& g = *run->gen;
      g.rendezvous.FailAll(unavailable, deferred);
      g.store->Abort(unavailable, deferred);
      g.barriers->Abort(unavailable, deferred);
      if (g.round && (g.round->state == CheckpointRound::State::kOpen)) {
        for (auto& [rank, reply] : g.round->waiting)
          deferred.Complete(reply, absl::StatusOr<v1::CommitCheckpointResponse>(unavailable));
        g.round->waiting.clear();
        for (auto& reply : g.round->begin_waiting)
          deferred.Complete(reply, absl::StatusOr<v1::BeginCheckpointResponse>(unavailable));
        g.round->begin_waiting.clear();
      }
      if (g.capture) {
        for (auto& reply : g.capture->waiting) deferred.Complete(reply, absl::StatusOr<v1::StackCapture>(unavailable));
        g.capture->waiting.clear();
      }
      PersistRanks(*run, deferred);
    }
    for (auto& [id, watcher] : run->watchers) {
      WatchCallback cb = watcher.callback;
      deferred.Add([cb, unavailable] {
        WatchUpdate update;
        update.done = true;
        update.end = unavailable;
        cb(update);
      });
    }
    run->watchers.clear();
  }
  // A checkpoint being verified finishes (and notifies observers) before the caller tears them down.
  file_work_->Drain();
}

void Coordinator::AwaitFileWork() { file_work_->Drain(); }

}  // namespace dt
