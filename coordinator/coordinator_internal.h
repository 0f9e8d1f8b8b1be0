// Per-run state of the Coordinator, shared by its coordinator_*.cc files and its managers' files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "common/proto_time.h"
#include "common/run_state.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/coordinator.h"
#include "coordinator/stack_captures.h"

namespace dt {

struct Coordinator::Generation {
  Generation(int64_t n, int nodes, int procs_per_node, std::vector<std::string> only_nodes)
      : number(n), rendezvous(nodes, procs_per_node, std::move(only_nodes)) {}
  int64_t number;
  Rendezvous rendezvous;
  bool assigned = false;
  std::vector<v1::RankStatus> ranks;  // by rank, once assigned
  // node → (its first rank, its ranks): built from `ranks` on first use, so a registration after
  // the assignment finds its seat without a scan of every rank.
  absl::flat_hash_map<std::string, std::pair<int, int>> node_ranks;
  std::unique_ptr<HealthTracker> health;
  std::shared_ptr<KvStore> store;
  std::unique_ptr<BarrierTable> barriers;
  std::shared_ptr<CheckpointRound> round;  // the open round, or the last one
  int64_t arriving_step = 0;               // step of the checkpoint arrival in progress
  bool arriving_sharded = false;           // whether that arrival asked for a sharded round
  absl::Status stopped;                    // non-OK once the generation ended
  TimerQueue::Id rendezvous_timer = 0;
  // When rendezvous_timer fires: a late callback of a timer that was cancelled (the generation made
  // again at its number after someone joined) has another deadline and is ignored.
  absl::Time rendezvous_deadline = absl::InfiniteFuture();
  bool ranks_dirty = false;  // progress to flush (steps, heartbeats, pids, idle times)
  bool rows_dirty = false;   // and a rank's record changed too (finished, stopped, pre-flight)
  absl::Time last_flush;
  int preempted_by = 0;                        // the signal with which a rank left after the preemption checkpoint
  bool time_limit = false;                     // a rank said the signal came with the job's time limit near
  int preflights_reported = 0;                 // ranks whose RankStatus.preflight is set
  std::unique_ptr<CaptureInProgress> capture;  // a stack capture waiting for the ranks
  absl::Time assigned_at;                      // when the rendezvous completed
};

// The idle timeout of a run's ranks (zero: not watched): --exec runs only, where dtrun measures it.
absl::Duration IdleTimeout(const v1::RunSpec& spec);

// FAILED_PRECONDITION for a call that needs run `r` going: names the run and the state it ended in.
absl::Status RunEndedError(const v1::Run& r);

// The run's record in its experiment directory (for people and tools reading the directory).
inline constexpr char kRunJsonFile[] = "run.json";

// What a run holds of --max-ranks: its world, or one rank per node while its nodes have not
// counted their processes (--nproc-per-node gpu|cpu|auto; the first count takes the rest).
inline int64_t RanksToAdmit(int64_t world_size, int32_t nodes) { return std::max<int64_t>(world_size, nodes); }

}  // namespace dt

// The per-run opening of a Coordinator call: finds the run `run_id` names as `run` and holds its
// lock to the end of the enclosing scope as `locked` (replies decided under it go to
// locked.deferred() and are delivered once the lock is released). Where there is no such run, the
// enclosing function returns FindRun's error (NOT_FOUND, or INVALID_ARGUMENT for a malformed id).
// A macro rather than a function: clang's -Wthread-safety sees a lock as held only in the scope
// whose object took it.
#define DT_OPEN_RUN_OR_RETURN(run, locked, run_id) DT_OPEN_RUN_OR_(run, locked, run_id, return dt_found_##run.status())
// The same in a function that returns nothing: a timer's or a withdrawn call's follow-up, for
// which a run that has gone needs no answer.
#define DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id) DT_OPEN_RUN_OR_(run, locked, run_id, return )
// The same in a call answered through `reply`, a PendingPtr: FindRun's error goes to it.
#define DT_OPEN_RUN_OR_REPLY(run, locked, run_id, reply) \
  DT_OPEN_RUN_OR_(run, locked, run_id, {                 \
    (reply)->Complete(dt_found_##run.status());          \
    return;                                              \
  })
#define DT_OPEN_RUN_OR_(run, locked, run_id, on_missing)                      \
  absl::StatusOr<::dt::Coordinator::RunPtr> dt_found_##run = FindRun(run_id); \
  if (!dt_found_##run.ok()) on_missing;                                       \
  const ::dt::Coordinator::RunPtr run = *std::move(dt_found_##run);           \
  ::dt::Coordinator::LockedRun locked(*run)
