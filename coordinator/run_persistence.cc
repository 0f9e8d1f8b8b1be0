// A run's persistence: its record, rank rows and progress in the state database, and run.json.
#include "coordinator/run_persistence.h"

#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "absl/time/time.h"
#include "common/log.h"
#include "common/proto_time.h"
#include "common/run_state.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"

namespace dt {

void Coordinator::RunPersistence::Persist(RunEntry& run, Deferred& deferred) {
  *run.stored.run.mutable_updated_at() = ToProtoTime(coordinator_.clock_->Now());
  deferred.AddWrite([this, entry = run.shared_from_this(), sequence = ++run.persist_sequence, stored = run.stored] {
    WriteRecord(*entry, sequence, stored);
  });
}

void Coordinator::RunPersistence::TakeRankProgress(RunEntry& run) {
  Generation& g = *run.gen;
  if (g.health) {
    for (auto& r : g.ranks) {
      r.set_step(g.health->step(r.rank()));
      *r.mutable_last_heartbeat() = ToProtoTime(g.health->last_heartbeat(r.rank()));
    }
  }
  g.rows_dirty = false;
}

void Coordinator::RunPersistence::MarkProgressTaken(RunEntry& run) {
  Generation& g = *run.gen;
  if (g.health) run.stored.run.set_step(g.health->group_step());
  g.ranks_dirty = false;
  g.last_flush = coordinator_.clock_->Now();
}

void Coordinator::RunPersistence::PersistRanks(RunEntry& run, Deferred& deferred) {
  if (!run.gen) return;
  TakeRankProgress(run);
  MarkProgressTaken(run);
  deferred.AddWrite([this, entry = run.shared_from_this(), sequence = ++run.persist_sequence,
                     run_id = run.stored.run.run_id(),
                     ranks = run.gen->ranks] { WriteRanks(*entry, sequence, run_id, ranks); });
}

v1::RankProgress Coordinator::RunPersistence::ProgressRecord(const Generation& g) {
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

void Coordinator::RunPersistence::FlushProgress(const RunPtr& run) {
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
  *run->stored.run.mutable_updated_at() = ToProtoTime(coordinator_.clock_->Now());
  run->unwritten_progress = std::make_shared<ProgressSnapshot>(
      ProgressSnapshot{++run->persist_sequence, run->stored, std::move(progress), std::move(rows)});
  if (task_waiting) return;
  coordinator_.file_work_->Post(run->stored.run.run_id(), [this, run] {
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

void Coordinator::RunPersistence::WriteProgress(RunEntry& run, uint64_t sequence, const std::string& run_id,
                                                const v1::RankProgress& progress) {
  absl::MutexLock lock(&run.persist_mu);
  if (sequence <= run.progress_written) return;
  if (absl::Status s = coordinator_.db_->SaveRankProgress(run_id, progress); !s.ok()) {
    DT_LOG(Error) << "cannot persist the progress of run " << run_id << ": " << s.message();
    return;
  }
  run.progress_written = sequence;
}

void Coordinator::RunPersistence::WriteRecord(RunEntry& run, uint64_t sequence, const StoredRun& stored) {
  absl::MutexLock lock(&run.persist_mu);
  if (sequence <= run.record_written) return;
  if (absl::Status s = coordinator_.db_->SaveRun(stored); !s.ok()) {
    DT_LOG(Error) << "cannot persist run " << stored.run.run_id() << ": " << s.message();
    return;
  }
  run.record_written = sequence;
}

void Coordinator::RunPersistence::WriteRanks(RunEntry& run, uint64_t sequence, const std::string& run_id,
                                             const std::vector<v1::RankStatus>& ranks) {
  absl::MutexLock lock(&run.persist_mu);
  if (sequence <= run.ranks_written) return;
  if (absl::Status s = coordinator_.db_->SaveRanks(run_id, ranks); !s.ok()) {
    DT_LOG(Error) << "cannot persist ranks of run " << run_id << ": " << s.message();
    return;
  }
  run.ranks_written = sequence;
}

std::function<void()> Coordinator::RunPersistence::RunJsonWriter(const RunEntry& run) const {
  const v1::Run& r = run.stored.run;
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(r.spec(), &spec_json, options);
  nlohmann::json doc;
  doc["run_id"] = r.run_id();
  doc["spec"] = nlohmann::json::parse(spec_json, nullptr, false);
  doc["world_size"] = r.world_size();  // the current generation's
  doc["generation"] = r.generation();
  doc["restarts"] = r.restarts();
  doc["created_at"] = absl::FormatTime(absl::RFC3339_sec, FromProtoTime(r.created_at()), absl::UTCTimeZone());
  doc["resumed_from_step"] = r.resumed_from_step();
  doc["coordinator_version"] = coordinator_.options_.version;
  nlohmann::json hosts = nlohmann::json::array();
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
  return [hook = coordinator_.options_.before_file_work, run_id = r.run_id(), exp_dir = r.exp_dir(),
          identity = r.exp_dir_identity(), text = doc.dump(2) + "\n"] {
    if (hook) hook(exp_dir);
    absl::StatusOr<DirFd> exp = OpenExperimentDir(exp_dir, identity);
    absl::Status written = exp.ok() ? exp->WriteFileAtomic(kRunJsonFile, text) : exp.status();
    if (!written.ok()) {
      DT_LOG(Warning) << "run " << run_id << ": cannot write " << kRunJsonFile << ": " << written.message();
    }
  };
}

void Coordinator::RunPersistence::WriteRunJson(const RunEntry& run) const {
  coordinator_.file_work_->Post(run.stored.run.run_id(), RunJsonWriter(run));
}

}  // namespace dt
