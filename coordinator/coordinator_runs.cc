// The runs API: submissions and their checks, listing, cancelling, launches attaching, excluded
// nodes, experiment directories, the census, and watchers.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/crypto.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "common/procs_per_node.h"
#include "common/run_env.h"
#include "common/run_state.h"
#include "coordinator/checkpoint_publisher.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/request_checks.h"
#include "coordinator/run_persistence.h"

namespace dt {
namespace {

// How a submission is named when --max-ranks refuses it.
std::string AdmissionName(const v1::RunSpec& spec) {
  return absl::StrCat("run ", Quote(spec.experiment_name()), " (", spec.nodes(), " node(s))");
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
  *out.mutable_timeouts() = policy_;
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
  if (absl::Status s = ValidateRunSpec(request_spec); !s.ok()) return s;
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
  *out.mutable_timeouts() = policy_;
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
    write_run_json = persistence_->RunJsonWriter(*run);
  }
  persistence_->WriteRecord(*run, sequence, stored);
  write_run_json();
  return run;
}

absl::StatusOr<v1::Run> Coordinator::GetRun(const std::string& run_id) {
  DT_OPEN_RUN_OR_RETURN(run, locked, run_id);
  return Snapshot(*run, /*with_ranks=*/true);
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
  DT_OPEN_RUN_OR_RETURN(run, locked, run_id);
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
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  Deferred& deferred = locked.deferred();
  v1::Run& r = run->stored.run;
  // The admin's dtctl passes this id to scancel/squeue: only the scheduler's own form is taken.
  absl::Status id_ok = r.spec().scheduler() == v1::SLURM ? ValidateSlurmJobId(request.scheduler_job_id())
                                                         : ValidateLocalJobId(request.scheduler_job_id());
  if (!id_ok.ok()) return id_ok;
  if (request.requeued() && r.spec().scheduler() != v1::SLURM) {
    return absl::InvalidArgumentError(
        absl::StrCat("requeued: run ", r.run_id(), " is not a Slurm run; only Slurm requeues a run's job"));
  }
  if (!request.batch_host().empty() && r.spec().scheduler() != v1::SLURM) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch host: run ", r.run_id(), " is not a Slurm run; only a Slurm job has a batch host"));
  }
  if (IsTerminal(r.state())) return RunEndedError(r);
  r.set_scheduler_job_id(request.scheduler_job_id());
  if (!request.launcher_host().empty()) r.set_launcher_host(request.launcher_host());
  if (!request.batch_host().empty()) r.set_batch_host(request.batch_host());
  if (request.requeued()) {
    r.clear_orphaned_job();  // done: no rank of the old job requeues the new one
    WholeAgainAfterRequeue(*run, deferred);
  }
  persistence_->Persist(*run, deferred);
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
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
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
    persistence_->Persist(*run, deferred);
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
  c.metric_batches_unstored = metrics_->Unstored();
  c.admitted_ranks = admission_.admitted();
  return c;
}

// Watchers: a snapshot at once, then every change until the run ends.

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
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  run->watchers.erase(watch_id);
}

}  // namespace dt
