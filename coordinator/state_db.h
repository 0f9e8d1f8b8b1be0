// The coordinator's durable state in embedded SQLite (WAL mode): runs, their ranks, failures,
// committed checkpoints and metric history. A restarted dtcoord loads every run it knew.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/wal_checkpointer.h"
#include "dt/v1/metrics.pb.h"
#include "dt/v1/runs.pb.h"
#include "dt/v1/stacks.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace dt {

// A run as stored: the public record plus what only the coordinator may see.
struct StoredRun {
  v1::Run run;               // without ranks and failures (stored in their own tables)
  std::string token_sha256;  // the run token's digest; the token itself is never stored
  std::string join_key;
  std::optional<v1::CheckpointInfo> resume_from;  // a checkpoint found in a reused exp dir
};

struct LoadedRun {
  StoredRun stored;
  std::vector<v1::RankStatus> ranks;
  std::vector<v1::Failure> failures;
  std::vector<v1::CheckpointInfo> checkpoints;  // ordered by step
};

// Progress over rank rows of the same generation: the higher step of the two (steps only grow),
// and where the progress heard the rank later than the row did, its heartbeat time, pid (when
// known) and idle time. Rows of another generation, or a record of another size, stay as they are.
void ApplyRankProgress(const v1::RankProgress& progress, std::vector<v1::RankStatus>& ranks);

class StateDb {
 public:
  // Opens (creating if needed) <path>, in WAL mode with synchronous=NORMAL: a committed
  // transaction survives a kill -9 of the coordinator.
  static absl::StatusOr<std::unique_ptr<StateDb>> Open(const std::string& path);
  ~StateDb();

  absl::Status SaveRun(const StoredRun& run);
  // Replaces every rank row of the run.
  absl::Status SaveRanks(const std::string& run_id, const std::vector<v1::RankStatus>& ranks);
  // Replaces the run's progress record (one row, whatever the number of ranks); LoadRuns applies
  // it over the ranks' rows.
  absl::Status SaveRankProgress(const std::string& run_id, const v1::RankProgress& progress);
  absl::Status AddFailure(const std::string& run_id, const v1::Failure& failure);
  absl::Status SaveCheckpoint(const std::string& run_id, const v1::CheckpointInfo& info);
  absl::Status DeleteCheckpoint(const std::string& run_id, int64_t step);
  // Stores a capture; of a run's on-demand (live) captures only the newest `keep_live` stay.
  absl::Status SaveStackCapture(const v1::StackCapture& capture, int keep_live);
  // A run's captures, newest first: every generation's, or one's.
  absl::StatusOr<std::vector<v1::StackCapture>> LoadStackCaptures(const std::string& run_id,
                                                                  std::optional<int64_t> generation, int limit);
  // The points of many ranks' batches, one row per batch, in one transaction: the coordinator
  // stores what arrived while the previous transaction committed together (one WAL append and
  // one commit, not one per batch). All or none are stored.
  struct MetricAppend {
    const std::string* run_id;
    int32_t rank;
    const v1::MetricBatch* batch;  // stored whole; queries read its points
  };
  absl::Status AppendMetricBatches(const std::vector<MetricAppend>& appends);

  absl::StatusOr<std::vector<LoadedRun>> LoadRuns();
  struct MetricQuery {
    std::string run_id;
    std::string name;             // empty: every metric
    std::optional<int32_t> rank;  // unset: every rank
    int64_t from_step = 0;
    std::optional<v1::MetricCursor> after;  // only records after this one
    int32_t limit = 1;                      // at least 1
    // Stored batches one call may decode: a query that would read more (a name no batch holds,
    // over a long history) returns what it found so far and a cursor to go on from.
    int64_t max_batches = kMaxMetricBatchesPerQuery;
    std::function<void()> on_batch;  // tests: called for each batch read
  };
  static constexpr int64_t kMaxMetricBatchesPerQuery = 20'000;
  // The first `limit` records from `from_step` (and after `after`), in (step, rank, name) order;
  // `more` tells whether any record follows them. Reads batches in step order and stops once no
  // unread batch can hold a record among the first `limit`.
  struct MetricPage {
    std::vector<v1::MetricRecord> records;
    bool more = false;
    std::optional<v1::MetricCursor> next;  // set with `more`: where the next page starts
    int64_t batches_read = 0;              // stored batches decoded for this page
  };
  absl::StatusOr<MetricPage> QueryMetrics(const MetricQuery& query);
  // Its statement. Served from metric_batches_by_first_step in step order, so a page stops early;
  // only batches that start at the same step are sorted (by rowid) before they are read. ?4 lets
  // a page that starts late in a run seek there: no batch ending at or after ?2 starts before
  // ?2 less the run's widest batch (WidestBatch).
  static constexpr const char* kMetricPageQuery =
      "SELECT rowid, rank, first_step, points FROM metric_batches WHERE run_id = ?1 AND first_step >= ?4 AND "
      "last_step >= ?2 AND (?3 < 0 OR rank = ?3) ORDER BY first_step, rowid";

 private:
  explicit StateDb(sqlite3* db);
  // FAILED_PRECONDITION when the file holds tables but not dtcoord's (another program's database).
  absl::Status CheckIsOurs(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Commit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // rolls back when COMMIT fails
  sqlite3_stmt* Prepare(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InsertMetricRow(const std::string& run_id, int32_t rank, int64_t first_step, int64_t last_step,
                               const std::string& points) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The run's widest stored batch (last_step - first_step): from memory once the run's batches
  // have been scanned for it, else by that scan (its index entries, once per run).
  absl::StatusOr<int64_t> WidestBatch(const std::string& run_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, sqlite3_stmt*>> cache_ ABSL_GUARDED_BY(mu_);
  // A second connection for the long reads (metric history, stack captures): in WAL mode it reads
  // while the first one writes, so one run's query never holds another run's writes.
  absl::Mutex read_mu_ ABSL_ACQUIRED_AFTER(mu_);
  sqlite3* read_db_ ABSL_GUARDED_BY(read_mu_) = nullptr;
  // Each run's widest batch. The writer widens a run's entry before it commits, so a scan that
  // missed the newest batch still learns its width here; `scanned` once the stored batches are in.
  struct Widest {
    int64_t steps = 0;
    bool scanned = false;
  };
  absl::Mutex widest_mu_ ABSL_ACQUIRED_AFTER(read_mu_);
  std::map<std::string, Widest> widest_ ABSL_GUARDED_BY(widest_mu_);
  // Checkpoints the WAL off the writer's commits (coordinator/wal_checkpointer.h).
  std::unique_ptr<WalCheckpointer> checkpointer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dt
