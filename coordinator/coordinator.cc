// The run registry: construction, authorization, lookup, loading the runs at start-up, shutdown.
// The rest of Coordinator: coordinator_run_lifecycle.cc (states, generations, failures,
// persistence), coordinator_runs.cc (the runs API and watchers); and the managers it owns, one
// per concern (manager_base.h): rank_registration, store_barriers, health_monitor,
// metric_pipeline, stack_captures, checkpoint_leadership.
#include "coordinator/coordinator.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"
#include "common/run_state.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/checkpoint_publisher.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/health_monitor.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/rank_registration.h"
#include "coordinator/run_persistence.h"
#include "coordinator/stack_captures.h"
#include "coordinator/store_barriers.h"

namespace dt {
namespace {

// Runs' file work proceeds in parallel up to this; one run's work is always in order.
constexpr int kFileWorkThreads = 4;

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
      health_work_(std::make_unique<FileWorkQueue>(1)) {
  metrics_ = std::make_unique<MetricPipeline>(*this);
  persistence_ = std::make_unique<RunPersistence>(*this);
  registration_ = std::make_unique<RankRegistration>(*this);
  store_barriers_ = std::make_unique<StoreAndBarriers>(*this);
  stacks_ = std::make_unique<StackCaptures>(*this);
  checkpoints_ = std::make_unique<CheckpointLeadership>(*this);
  health_ = std::make_unique<HealthMonitor>(*this);
}

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

std::vector<RunObserver*> Coordinator::Observers() const {
  absl::MutexLock lock(&observers_mu_);
  return observers_list_;
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
      run->ranks_admitted = RanksToAdmit(WorldSize(r.spec()), r.spec().nodes());
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
      health_->CheckHealth();
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
      checkpoints_->FailWaiting(*run, unavailable, deferred);
      stacks_->FailWaiting(*run, unavailable, deferred);
      persistence_->PersistRanks(*run, deferred);
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
