// A run's persistence: its record, its rank rows and its progress in the state database, and
// <exp_dir>/run.json. Each is snapshotted under the run's lock and written off it: state changes
// once the lock is released (Deferred::AddWrite), the periodic progress flush and run.json on the
// run's file work. Writes carry the sequence of their snapshot (RunEntry::persist_sequence), and
// one older than the last written is skipped, so writes that overtake each other lose nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class Coordinator::RunPersistence : private ManagerBase {
 public:
  explicit RunPersistence(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // Snapshots the run's record (its update time now); `deferred` writes it once the lock is released.
  void Persist(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Snapshots the rank rows with the health tracker's steps and heartbeats; written likewise.
  void PersistRanks(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Saves the run's progress (its record and the ranks' progress record, the rank rows too when
  // a rank's record changed) from a snapshot, on the run's file work. At most one snapshot per run
  // waits there: a stalled disk leaves one per run queued, not one per period.
  void FlushProgress(const RunPtr& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  // Writes the record snapshot numbered `sequence` unless a newer one was written.
  void WriteRecord(RunEntry& run, uint64_t sequence, const StoredRun& stored);
  // What writing <exp_dir>/run.json as the run is now takes, to run off the lock.
  std::function<void()> RunJsonWriter(const RunEntry& run) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);
  // Posts RunJsonWriter's work to the run's file work.
  void WriteRunJson(const RunEntry& run) const ABSL_SHARED_LOCKS_REQUIRED(run.mu);

 private:
  // Copies the health tracker's steps and heartbeat times into the rank records (their rows are
  // then up to date).
  void TakeRankProgress(RunEntry& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // The run's progress was just taken for writing: the run's step from the health tracker, and
  // the next flush not before the flush interval.
  void MarkProgressTaken(RunEntry& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Every rank's step, heartbeat time, pid and idle time as one record.
  static v1::RankProgress ProgressRecord(const Generation& g);
  // Write the snapshot numbered `sequence` unless a newer one was written.
  void WriteRanks(RunEntry& run, uint64_t sequence, const std::string& run_id,
                  const std::vector<v1::RankStatus>& ranks);
  void WriteProgress(RunEntry& run, uint64_t sequence, const std::string& run_id, const v1::RankProgress& progress);
};

}  // namespace dt
