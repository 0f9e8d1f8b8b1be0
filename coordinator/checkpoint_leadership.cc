// Checkpoint rounds (checkpoint_leadership.h): the round under the run's lock, its directory and publication on the
// file work.
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crypto.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/utf8.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/checkpoint_publisher.h"
#include "coordinator/checkpoint_shards.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/request_checks.h"
#include "coordinator/run_persistence.h"

namespace dt {
namespace {

constexpr char kCheckpointBarrier[] = "dt.checkpoint";

// The file-work key of a run's publications and their retention passes. Not a run id: a run id
// has no space.
std::string PublicationWorkKey(const std::string& run_id) { return absl::StrCat(run_id, " publication"); }

// "a sharded round" or "a single-writer round", for the ranks' disagreements.
const char* RoundKind(bool sharded) { return sharded ? "a sharded round" : "a single-writer round"; }

// "ranks 1, 3" of `world` that are not in `committed`.
std::string RanksNotIn(int world, const std::map<int, PendingPtr<v1::CommitCheckpointResponse>>& committed) {
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (!committed.count(r)) missing.push_back(r);
  }
  return absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "));
}

}  // namespace

void Coordinator::CheckpointLeadership::Begin(const v1::BeginCheckpointRequest& request,
                                              PendingPtr<v1::BeginCheckpointResponse> reply) {
  if (absl::Status s = ValidateBeginCheckpointRequest(request); !s.ok()) {
    reply->Complete(s);
    return;
  }
  DT_OPEN_RUN_OR_REPLY(run, locked, request.run_id(), reply);
  Deferred& deferred = locked.deferred();
  absl::StatusOr<Generation*> live = coordinator_.LiveGeneration(*run, request.generation(), request.rank());
  if (!live.ok()) {
    deferred.Complete<v1::BeginCheckpointResponse>(reply, live.status());
    return;
  }
  Generation& g = **live;
  if (!g.assigned) {
    deferred.Complete<v1::BeginCheckpointResponse>(
        reply, absl::FailedPreconditionError("checkpoint before rendezvous completed"));
    return;
  }
  if (g.round &&
      (g.round->state == CheckpointRound::State::kOpen || g.round->state == CheckpointRound::State::kVerifying)) {
    if (g.round->step == request.step() && g.round->sharded != request.sharded()) {
      deferred.Complete<v1::BeginCheckpointResponse>(
          reply, absl::FailedPreconditionError(absl::StrCat("rank ", request.rank(), " asked for ",
                                                            RoundKind(request.sharded()), " at step ", request.step(),
                                                            " but the open round is ", RoundKind(g.round->sharded))));
      return;
    }
    if (g.round->step == request.step()) {
      // This rank's earlier Begin reply was lost: the round it opened is still the one.
      ReplyToBegin(run->stored.run.run_id(), *g.round, reply, deferred);
      return;
    }
    deferred.Complete<v1::BeginCheckpointResponse>(
        reply, absl::FailedPreconditionError(absl::StrCat("rank ", request.rank(), " asked for a checkpoint at step ",
                                                          request.step(), " while the round for step ", g.round->step,
                                                          " is still open")));
    return;
  }
  if (g.arriving_step != 0 && g.arriving_step != request.step()) {
    deferred.Complete<v1::BeginCheckpointResponse>(
        reply, absl::FailedPreconditionError(absl::StrCat("rank ", request.rank(), " asked for a checkpoint at step ",
                                                          request.step(), " but other ranks asked for step ",
                                                          g.arriving_step, ": the ranks disagree on the step")));
    return;
  }
  if (g.arriving_step != 0 && g.arriving_sharded != request.sharded()) {
    deferred.Complete<v1::BeginCheckpointResponse>(
        reply, absl::FailedPreconditionError(absl::StrCat(
                   "rank ", request.rank(), " asked for ", RoundKind(request.sharded()), " at step ", request.step(),
                   " but other ranks asked for ", RoundKind(g.arriving_sharded), ": the ranks disagree")));
    return;
  }
  g.arriving_step = request.step();
  g.arriving_sharded = request.sharded();
  absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                    : absl::Milliseconds(coordinator_.policy_.barrier_timeout_ms());
  int64_t generation = g.number;
  int64_t step = request.step();
  int rank = request.rank();
  bool sharded = request.sharded();
  // Weak: the pending lives in the run's own barrier table, and a strong reference would keep
  // the run (and the table) alive in a cycle.
  std::weak_ptr<RunEntry> weak_run = run;
  auto arrived = MakePending<BarrierRelease>(
      [this, weak_run, generation, rank, step, sharded, reply](absl::StatusOr<BarrierRelease> r) {
        RunPtr run = weak_run.lock();
        if (!run) {
          reply->Complete(absl::UnavailableError("the coordinator is shutting down"));
          return;
        }
        if (!r.ok()) {
          {
            RunMutexLock lock(&run->mu);
            // A retry replacing this arrival (CANCELLED) leaves the instance open for `step`.
            if (r.status().code() != absl::StatusCode::kCancelled && run->gen->number == generation &&
                run->gen->arriving_step == step) {
              run->gen->arriving_step = 0;
            }
          }
          reply->Complete(r.status());
          return;
        }
        OpenRound(run, generation, rank, step, sharded, r->sequence, reply);
      });
  g.barriers->Arrive(request.rank(), kCheckpointBarrier, 0, timeout, arrived, deferred);
}

void Coordinator::CheckpointLeadership::ReplyToBegin(const std::string& run_id, CheckpointRound& round,
                                                     const PendingPtr<v1::BeginCheckpointResponse>& reply,
                                                     Deferred& deferred) {
  if (round.state == CheckpointRound::State::kAborted) {
    ReplyBehindRemoval(run_id, reply, round.outcome);
  } else if (round.checkpoints == nullptr) {
    round.begin_waiting.push_back(reply);  // the partial directory is being made
  } else {
    v1::BeginCheckpointResponse out;
    out.set_round_id(round.id);
    out.set_writer_rank(round.writer);
    out.set_partial_dir(round.partial_dir);
    out.set_final_dir(round.final_dir);
    out.set_lease_ms(coordinator_.policy_.checkpoint_lease_ms());
    out.set_sharded(round.sharded);
    out.set_world_size(round.world);
    deferred.Complete<v1::BeginCheckpointResponse>(reply, out);
  }
}

void Coordinator::CheckpointLeadership::OpenRound(const RunPtr& run, int64_t generation, int rank, int64_t step,
                                                  bool sharded, uint64_t sequence,
                                                  const PendingPtr<v1::BeginCheckpointResponse>& reply) {
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  Generation& g = *run->gen;
  if (g.number != generation || !g.stopped.ok()) {
    deferred.Complete<v1::BeginCheckpointResponse>(
        reply,
        g.number != generation ? absl::AbortedError(absl::StrCat("generation ", generation, " has ended")) : g.stopped);
    return;
  }
  if (!g.round || g.round->sequence != sequence) {
    // The first rank released from the arrival barrier opens the round.
    auto round = std::make_shared<CheckpointRound>();
    const v1::Run& r = run->stored.run;
    std::string nonce = RandomHex(4);
    round->id = absl::StrCat(generation, ".", step, ".", nonce);
    round->generation = generation;
    round->sequence = sequence;
    round->step = step;
    round->sharded = sharded;
    round->world = static_cast<int>(g.ranks.size());
    round->writer = 0;  // every rank of a live generation is alive: the lowest is rank 0
    for (const auto& rs : g.ranks) {
      if (rs.state() == v1::RankStatus::ACTIVE) {
        round->writer = rs.rank();
        break;
      }
    }
    if (sharded) round->writer = -1;
    round->writer_desc = sharded ? std::string("every rank") : coordinator_.DescribeRank(*run, round->writer);
    std::string checkpoints_dir = ExperimentPaths(r.exp_dir()).checkpoints_dir;
    round->partial_name = PartialDirName(step, nonce);
    round->partial_dir = JoinPath(checkpoints_dir, round->partial_name);
    round->final_dir = JoinPath(checkpoints_dir, CheckpointDirName(step));
    round->opened = coordinator_.clock_->Now();
    g.round = round;
    g.arriving_step = 0;
    // The directory is made on the run's file work, off this lock: on a stalled file system the
    // ranks' Begin calls wait there, and every other call of the run goes on.
    coordinator_.file_work_->Post(r.run_id(),
                                  [this, run, round, exp_dir = r.exp_dir(), identity = r.exp_dir_identity()] {
                                    if (coordinator_.options_.before_file_work)
                                      coordinator_.options_.before_file_work(exp_dir);
                                    absl::StatusOr<DirFd> checkpoints = OpenCheckpointsDir(exp_dir, identity);
                                    absl::Status made = checkpoints.status();
                                    if (checkpoints.ok()) made = checkpoints->MakeSub(round->partial_name).status();
                                    std::shared_ptr<const DirFd> dir;
                                    if (checkpoints.ok()) dir = std::make_shared<const DirFd>(std::move(*checkpoints));
                                    PartialDirMade(run, round, std::move(dir), made);
                                  });
  }
  CheckpointRound& round = *g.round;
  if (round.step != step || round.sharded != sharded) {
    // Released by the same barrier as ranks that asked otherwise (an arrival after a timed-out
    // one can reopen the barrier before the guard on the step is cleared): the ranks would write
    // different rounds, so none is written.
    absl::Status differs = absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " asked for ", RoundKind(sharded), " at step ", step, " but the ranks released with it opened ",
        RoundKind(round.sharded), " at step ", round.step, ": the ranks disagree"));
    if (round.state == CheckpointRound::State::kOpen) AbortRound(*run, round, differs, deferred);
    ReplyBehindRemoval(run->stored.run.run_id(), reply, differs);
    return;
  }
  ReplyToBegin(run->stored.run.run_id(), round, reply, deferred);
}

template <typename T>
void Coordinator::CheckpointLeadership::ReplyBehindRemoval(const std::string& run_id, const PendingPtr<T>& reply,
                                                           typename std::common_type<absl::StatusOr<T>>::type result) {
  coordinator_.file_work_->Post(run_id, [reply, result = std::move(result)] { reply->Complete(result); });
}

void Coordinator::CheckpointLeadership::PartialDirMade(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round,
                                                       std::shared_ptr<const DirFd> checkpoints,
                                                       const absl::Status& made) {
  bool orphaned = false;
  {
    LockedRun locked(*run);
    Deferred& deferred = locked.deferred();
    round->checkpoints = checkpoints;
    std::vector<PendingPtr<v1::BeginCheckpointResponse>> waiting;
    waiting.swap(round->begin_waiting);
    if (round->state == CheckpointRound::State::kAborted) {
      orphaned = made.ok();  // aborted meanwhile: nothing else removes what was just made
    } else if (!made.ok()) {
      AbortRound(*run, *round, made, deferred);
    } else {
      std::string run_id = run->stored.run.run_id();
      round->lease_timer = coordinator_.timers_->Schedule(
          coordinator_.clock_->Now() + absl::Milliseconds(coordinator_.policy_.checkpoint_lease_ms()),
          [this, run_id, round_id = round->id] { OnLeaseExpired(run_id, round_id); });
    }
    for (const auto& reply : waiting) ReplyToBegin(run->stored.run.run_id(), *round, reply, deferred);
  }
  if (orphaned) {
    if (absl::Status s = RemoveAbortedPartial(*checkpoints, round->partial_name); !s.ok()) {
      DT_LOG(Error) << s.message();
    }
  }
}

void Coordinator::CheckpointLeadership::Commit(const v1::CommitCheckpointRequest& request,
                                               PendingPtr<v1::CommitCheckpointResponse> reply) {
  DT_OPEN_RUN_OR_REPLY(run, locked, request.run_id(), reply);
  Deferred& deferred = locked.deferred();
  Generation& g = *run->gen;
  std::shared_ptr<CheckpointRound> round = g.round;
  if (request.generation() != g.number || !round || round->id != request.round_id()) {
    absl::Status live = coordinator_.LiveGeneration(*run, request.generation(), request.rank()).status();
    deferred.Complete<v1::CommitCheckpointResponse>(
        reply, !live.ok() ? live
                          : absl::InvalidArgumentError(
                                absl::StrCat("unknown checkpoint round ", request.round_id(),
                                             " (the coordinator may have restarted, which voids open rounds)")));
    return;
  }
  int world = static_cast<int>(g.ranks.size());
  if (request.rank() < 0 || request.rank() >= world) {
    deferred.Complete<v1::CommitCheckpointResponse>(
        reply, absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " is outside 0..", world - 1)));
    return;
  }
  switch (round->state) {
    case CheckpointRound::State::kCommitted: {
      v1::CommitCheckpointResponse out;
      *out.mutable_checkpoint() = round->info;
      deferred.Complete<v1::CommitCheckpointResponse>(reply, out);
      return;
    }
    case CheckpointRound::State::kAborted:
      ReplyBehindRemoval(run->stored.run.run_id(), reply, round->outcome);
      return;
    default:
      break;
  }
  if (round->sharded) {
    CommitShard(run, round, request, reply, deferred);
    return;
  }
  if (absl::Status s = TakeSingleWriterCommit(*round, request); !s.ok()) {
    RefuseCommit(run, *round, s, reply, deferred);
    return;
  }
  AwaitPublication(run, round, request.rank(), reply, deferred);
}

absl::Status Coordinator::CheckpointLeadership::TakeSingleWriterCommit(CheckpointRound& round,
                                                                       const v1::CommitCheckpointRequest& request) {
  bool is_writer = request.rank() == round.writer;
  if (!is_writer && request.has_manifest() && request.manifest().files_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " sent a manifest but the writer of this round is rank ", round.writer));
  }
  if (!is_writer && !request.layout_json().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " sent a layout but the writer of this round is rank ", round.writer));
  }
  if (!is_writer || round.state != CheckpointRound::State::kOpen) return absl::OkStatus();
  if (absl::Status s = ValidateManifest(request.manifest()); !s.ok()) return s;
  std::string layout;
  if (!request.layout_json().empty()) {
    absl::StatusOr<nlohmann::json> parsed = ParseLayout(absl::StrCat("rank ", request.rank()), request.layout_json());
    if (!parsed.ok()) return parsed.status();
    layout = parsed->dump();
  }
  round.layout_json = std::move(layout);  // a retry's replaces the first call's, as its manifest does
  round.manifest = request.manifest();
  return absl::OkStatus();
}

void Coordinator::CheckpointLeadership::RefuseCommit(const RunPtr& run, CheckpointRound& round,
                                                     const absl::Status& cause,
                                                     const PendingPtr<v1::CommitCheckpointResponse>& reply,
                                                     Deferred& deferred) {
  // A commit that cannot be part of the checkpoint ends an open round for every rank, saying why:
  // left open, the other ranks would wait out the lease. (Once every rank is in, the round is
  // being published and the refusal is this call's alone.) The refused rank hears after the
  // round's directory is gone, as every other rank does.
  if (round.state == CheckpointRound::State::kOpen) AbortRound(*run, round, cause, deferred);
  ReplyBehindRemoval(run->stored.run.run_id(), reply, cause);
}

void Coordinator::CheckpointLeadership::CommitShard(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round,
                                                    const v1::CommitCheckpointRequest& request,
                                                    const PendingPtr<v1::CommitCheckpointResponse>& reply,
                                                    Deferred& deferred) {
  if (round->state == CheckpointRound::State::kOpen) {
    if (absl::Status s = round->shards.Accept(request.rank(), request.manifest(), request.layout_json()); !s.ok()) {
      RefuseCommit(run, *round, s, reply, deferred);
      return;
    }
  }
  AwaitPublication(run, round, request.rank(), reply, deferred);
}

void Coordinator::CheckpointLeadership::AwaitPublication(const RunPtr& run,
                                                         const std::shared_ptr<CheckpointRound>& round, int rank,
                                                         const PendingPtr<v1::CommitCheckpointResponse>& reply,
                                                         Deferred& deferred) {
  auto [it, inserted] = round->waiting.try_emplace(rank, reply);
  if (!inserted) {
    deferred.Complete(it->second, absl::StatusOr<v1::CommitCheckpointResponse>(
                                      absl::CancelledError("replaced by a retry of the same rank")));
    it->second = reply;
  }
  // Published once every rank's block ended well: until then any rank may still abort the round.
  bool files_known =
      round->sharded ? static_cast<int>(round->shards.ranks()) == round->world : round->manifest.has_value();
  if (files_known && static_cast<int>(round->waiting.size()) == round->world &&
      round->state == CheckpointRound::State::kOpen) {
    StartPublish(run, round);
  }
}

namespace {

// The round writes through the checkpoints/ it held open at its start; the path it reports must
// lead to the same directory. OK (an empty info) while it does; ABORTED when checkpoints/ was moved,
// removed or swapped for a link since (the files would land where the reported path does not go).
absl::StatusOr<v1::CheckpointInfo> StillTheRoundsCheckpointsDir(const std::string& exp_dir,
                                                                const v1::ExperimentDirIdentity& identity,
                                                                const DirFd& held, int64_t step) {
  absl::StatusOr<DirFd> now = OpenCheckpointsDir(exp_dir, identity);
  if (now.ok() && now->device() == held.device() && now->inode() == held.inode()) return v1::CheckpointInfo();
  return absl::AbortedError(absl::StrCat("the checkpoint at step ", step, " was not published: ", exp_dir,
                                         "/checkpoints was moved, removed or replaced (a link?) since the round began",
                                         now.ok() ? "" : absl::StrCat(" (", now.status().message(), ")"),
                                         "; its files stay where they were written, unpublished"));
}

}  // namespace

void Coordinator::CheckpointLeadership::StartPublish(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round) {
  round->state = CheckpointRound::State::kVerifying;
  if (round->lease_timer != 0) coordinator_.timers_->Cancel(round->lease_timer);
  RoundWriters writers;
  writers.sharded = round->sharded;
  writers.world_size = round->world;
  writers.writer_rank = round->writer;
  v1::Manifest manifest;
  if (round->sharded) {
    manifest = round->shards.Combined(writers.file_ranks);
    writers.layout_json = round->shards.layout_json();
    round->shards = ShardCollector();
  } else {
    manifest = std::move(*round->manifest);
    round->manifest.reset();
    writers.layout_json = round->layout_json;
  }
  const std::string run_id = run->stored.run.run_id();
  coordinator_.file_work_->Post(
      PublicationWorkKey(run_id), [this, run, run_id, round, manifest, writers = std::move(writers),
                                   exp_dir = run->stored.run.exp_dir(), identity = run->stored.run.exp_dir_identity()] {
        absl::Time start = absl::Now();
        absl::StatusOr<v1::CheckpointInfo> result =
            StillTheRoundsCheckpointsDir(exp_dir, identity, *round->checkpoints, round->step);
        if (result.ok()) {
          result = VerifyAndPublish(*round->checkpoints, round->partial_name, round->step, manifest, writers,
                                    coordinator_.options_.checkpoint_verification);
        }
        if (result.ok() && writers.sharded) {
          std::vector<std::pair<int, int64_t>> files;
          for (int i = 0; i < manifest.files_size(); ++i)
            files.emplace_back(writers.file_ranks[i], manifest.files(i).size());
          SetShards(*result, files);
        }
        if (result.ok()) {
          DT_LOG(Info) << "run " << run_id << ": checkpoint step " << round->step << " verified and published ("
                       << result->bytes() << " bytes, " << absl::FormatDuration(absl::Now() - start) << ")";
        }
        FinishPublish(run, round, std::move(result));
      });
}

void Coordinator::CheckpointLeadership::FinishPublish(const RunPtr& run, const std::shared_ptr<CheckpointRound>& round,
                                                      absl::StatusOr<v1::CheckpointInfo> result) {
  Deferred deferred;  // runs last, after the replies and the retention pass
  Deferred writes;    // the database's record of the commit, written before the ranks hear of it
  std::vector<int64_t> keep;
  std::vector<PendingPtr<v1::CommitCheckpointResponse>> replies;
  v1::CommitCheckpointResponse out;
  std::string exp_dir;
  {
    RunMutexLock lock(&run->mu);
    exp_dir = run->stored.run.exp_dir();
    if (!result.ok()) {
      AbortRound(*run, *round, result.status(), deferred);
      return;
    }
    v1::CheckpointInfo info = *result;
    info.set_generation(round->generation);
    round->info = info;
    round->state = CheckpointRound::State::kCommitted;
    const std::string& run_id = run->stored.run.run_id();
    auto& list = run->checkpoints;
    list.erase(
        std::remove_if(list.begin(), list.end(), [&](const v1::CheckpointInfo& c) { return c.step() >= info.step(); }),
        list.end());
    list.push_back(info);
    writes.AddWrite([this, run_id, info] {
      if (absl::Status s = coordinator_.db_->SaveCheckpoint(run_id, info); !s.ok()) {
        DT_LOG(Error) << "cannot record checkpoint of run " << run_id << ": " << s.message();
      }
    });
    run->stored.run.set_latest_checkpoint_step(info.step());
    keep = Retire(*run, writes);
    *out.mutable_checkpoint() = info;
    for (auto& [rank, reply] : round->waiting) replies.push_back(reply);
    round->waiting.clear();
    if (coordinator_.stats_ != nullptr) {
      CoordinatorStats* stats = coordinator_.stats_;
      absl::Duration took = coordinator_.clock_->Now() - round->opened;
      int64_t bytes = info.bytes();
      deferred.Add([stats, took, bytes] { stats->ObserveCheckpointRound(true, took, bytes); });
    }
    // Progress is not a hang: a long checkpoint must not trip the watchdog.
    if (run->gen && run->gen->number == round->generation && run->gen->health) {
      Generation& g = *run->gen;
      for (const auto& rs : g.ranks) {
        if (!g.health->finished(rs.rank()))
          g.health->Heartbeat(rs.rank(), g.health->step(rs.rank()), coordinator_.clock_->Now());
      }
    }
    coordinator_.persistence_->Persist(*run, writes);
    coordinator_.Notify(*run, deferred);
  }
  writes.RunNow();
  // The ranks hear of the commit first: removing the checkpoints it retires (tens of milliseconds
  // per 200 MB on ext4, 0.3 s with `discard`) is not part of their round. It runs on the run's
  // publication sequence, so the run's next publication waits for it (the retired ones are gone
  // before a newer one lands), while the next round's Begin, on the run's own sequence, does not.
  for (auto& reply : replies) reply->Complete(out);
  if (coordinator_.options_.before_file_work) coordinator_.options_.before_file_work(exp_dir + " (retention)");
  if (absl::Status s = ApplyRetention(*round->checkpoints, keep); !s.ok()) {
    DT_LOG(Warning) << "retention in " << round->checkpoints->path() << ": " << s.message();
  }
}

std::vector<int64_t> Coordinator::CheckpointLeadership::Retire(RunEntry& run, Deferred& deferred) {
  auto keep_count = static_cast<size_t>(std::max(1, run.stored.run.spec().keep_checkpoints()));
  auto& list = run.checkpoints;
  while (list.size() > keep_count) {
    deferred.AddWrite([this, run_id = run.stored.run.run_id(), step = list.front().step()] {
      if (absl::Status s = coordinator_.db_->DeleteCheckpoint(run_id, step); !s.ok()) DT_LOG(Error) << s.message();
    });
    list.erase(list.begin());
  }
  std::vector<int64_t> keep;
  for (const auto& c : list) keep.push_back(c.step());
  // A checkpoint this run resumed from stays while fewer than K newer ones exist.
  if (run.stored.resume_from && list.size() < keep_count) keep.push_back(run.stored.resume_from->step());
  return keep;
}

void Coordinator::CheckpointLeadership::AbortRound(RunEntry& run, CheckpointRound& round, const absl::Status& cause,
                                                   Deferred& deferred) {
  if (round.state == CheckpointRound::State::kAborted || round.state == CheckpointRound::State::kCommitted) {
    return;
  }
  round.state = CheckpointRound::State::kAborted;
  round.outcome =
      cause.code() == absl::StatusCode::kAborted || cause.code() == absl::StatusCode::kDataLoss ||
              cause.code() == absl::StatusCode::kUnavailable
          ? cause
          : absl::AbortedError(absl::StrCat("checkpoint round for step ", round.step, " aborted: ", cause.message()));
  if (round.lease_timer != 0) coordinator_.timers_->Cancel(round.lease_timer);
  DT_LOG(Warning) << "run " << run.stored.run.run_id() << ": checkpoint round for step " << round.step
                  << " aborted: " << round.outcome.message();
  // Ranks still waiting for the partial directory hear from PartialDirMade, which always follows
  // and removes what it made for an aborted round before they do.
  round.shards = ShardCollector();  // what the ranks sent is not needed any more
  round.manifest.reset();
  round.layout_json.clear();
  std::vector<PendingPtr<v1::CommitCheckpointResponse>> replies;
  for (auto& [rank, reply] : round.waiting) replies.push_back(reply);
  round.waiting.clear();
  // Off this lock (and off the timer thread, for a lapsed lease): the partial directory goes
  // first, then the ranks hear of the abort, so a rank told "aborted" finds nothing left behind.
  coordinator_.file_work_->Post(run.stored.run.run_id(),
                                [dir = round.checkpoints, name = round.partial_name, replies, outcome = round.outcome] {
                                  if (dir) {
                                    if (absl::Status s = RemoveAbortedPartial(*dir, name); !s.ok()) {
                                      DT_LOG(Error) << s.message();
                                    }
                                  }
                                  for (const auto& reply : replies) reply->Complete(outcome);
                                });
  if (coordinator_.stats_ != nullptr) {
    CoordinatorStats* stats = coordinator_.stats_;
    absl::Duration took = coordinator_.clock_->Now() - round.opened;
    deferred.Add([stats, took] { stats->ObserveCheckpointRound(false, took, 0); });
  }
}

void Coordinator::CheckpointLeadership::AbortOpenRound(RunEntry& run, const absl::Status& cause, Deferred& deferred) {
  if (run.gen && run.gen->round && run.gen->round->state == CheckpointRound::State::kOpen) {
    AbortRound(run, *run.gen->round, cause, deferred);
  }
}

void Coordinator::CheckpointLeadership::OnLeaseExpired(const std::string& run_id, const std::string& round_id) {
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  Deferred& deferred = locked.deferred();
  std::shared_ptr<CheckpointRound> round = run->gen ? run->gen->round : nullptr;
  if (!round || round->id != round_id || round->state != CheckpointRound::State::kOpen) return;
  std::string lease = absl::FormatDuration(absl::Milliseconds(coordinator_.policy_.checkpoint_lease_ms()));
  std::string late = round->sharded ? absl::StrCat(RanksNotIn(round->world, round->waiting), " of the sharded round")
                                    : absl::StrCat("the writer ", round->writer_desc);
  AbortRound(*run, *round,
             absl::AbortedError(absl::StrCat("checkpoint round for step ", round->step, " aborted: ", late,
                                             " did not commit within the lease of ", lease)),
             deferred);
}

void Coordinator::CheckpointLeadership::Abort(const v1::AbortCheckpointRequest& request,
                                              PendingPtr<v1::AbortCheckpointResponse> reply) {
  DT_OPEN_RUN_OR_REPLY(run, locked, request.run_id(), reply);
  Deferred& deferred = locked.deferred();
  absl::StatusOr<Generation*> live = coordinator_.LiveGeneration(*run, request.generation(), request.rank());
  if (!live.ok()) {
    deferred.Complete<v1::AbortCheckpointResponse>(reply, live.status());
    return;
  }
  std::shared_ptr<CheckpointRound> round = (*live)->round;
  if (!round || round->id != request.round_id()) {
    deferred.Complete<v1::AbortCheckpointResponse>(
        reply, absl::InvalidArgumentError(absl::StrCat("unknown checkpoint round ", request.round_id())));
    return;
  }
  v1::AbortCheckpointResponse out;
  if (round->state != CheckpointRound::State::kOpen && round->state != CheckpointRound::State::kAborted) {
    // Every rank has committed (the round is being published, or is): an abort changes nothing.
    out.set_already_ended(absl::StrCat("the checkpoint round for step ", round->step, " was already committed"));
    deferred.Complete<v1::AbortCheckpointResponse>(reply, out);
    return;
  }
  if (round->state == CheckpointRound::State::kAborted) {
    out.set_already_ended(std::string(round->outcome.message()));
  } else {
    std::string who = request.rank() == round->writer ? absl::StrCat("the writer ", round->writer_desc)
                                                      : absl::StrCat("rank ", request.rank());
    AbortRound(*run, *round,
               absl::AbortedError(
                   absl::StrCat(who, " aborted the checkpoint at step ", round->step, ": ",
                                request.reason().empty() ? "no reason given" : TruncateUtf8(request.reason(), 4096))),
               deferred);
  }
  ReplyBehindRemoval(run->stored.run.run_id(), reply, out);
}

absl::StatusOr<v1::CheckpointInfo> Coordinator::CheckpointLeadership::Latest(const std::string& run_id) {
  DT_OPEN_RUN_OR_RETURN(run, locked, run_id);
  std::optional<v1::CheckpointInfo> latest = coordinator_.Latest(*run);
  if (!latest) return absl::NotFoundError(absl::StrCat("run ", run_id, " has no committed checkpoint"));
  return *latest;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> Coordinator::CheckpointLeadership::List(const std::string& run_id) {
  std::vector<v1::CheckpointInfo> out;
  std::optional<v1::CheckpointInfo> resume;  // the one the run resumed from, when none of its own
  {
    DT_OPEN_RUN_OR_RETURN(run, locked, run_id);
    resume = run->stored.resume_from;
    for (const auto& c : run->checkpoints) {
      if (resume && c.step() == resume->step()) resume.reset();
    }
    out.assign(run->checkpoints.begin(), run->checkpoints.end());
  }
  // Listed while it is still on disk (retention may have removed it); looked at off the run's
  // lock, which heartbeats take.
  struct stat st;
  if (resume && ::stat(resume->path().c_str(), &st) == 0) out.insert(out.begin(), *resume);
  return out;
}

void Coordinator::CheckpointLeadership::FailWaiting(RunEntry& run, const absl::Status& status, Deferred& deferred) {
  CheckpointRound* round = run.gen ? run.gen->round.get() : nullptr;
  if (round == nullptr || round->state != CheckpointRound::State::kOpen) return;
  for (auto& [rank, reply] : round->waiting) {
    deferred.Complete(reply, absl::StatusOr<v1::CommitCheckpointResponse>(status));
  }
  round->waiting.clear();
  for (auto& reply : round->begin_waiting)
    deferred.Complete(reply, absl::StatusOr<v1::BeginCheckpointResponse>(status));
  round->begin_waiting.clear();
}

}  // namespace dt
