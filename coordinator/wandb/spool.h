// One W&B run's durable queue. Every metric point is appended to points.bin (length-prefixed
// dt.v1.MetricSpoolRecord records: a batch's columns as one record, a point of the map form as one)
// before anything is sent (one write(2) per delivery pass, made before the streams that sent its
// batches are answered, so a killed coordinator loses nothing acknowledged; fdatasync
// about once a second against power loss). state.json records what W&B has accepted (points,
// history lines, last step) and is replaced atomically after each accepted post, so a restart
// resumes at the right offset and sends nothing twice. meta.json describes the W&B run.
//
// Spools of older coordinators (a record per point) load here. The reverse does not hold: a
// coordinator from before columns records were spooled reads one as a single empty point, so
// drain or remove the unfinished spools before a downgrade.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/wandb/wandb_protocol.h"
#include "dt/v1/metrics.pb.h"

namespace dt::wandb {

// Points read from a spool. A name is stored once per read: a point's values name their metric
// by its index in `names`, so reading 20,000 points of 8 values allocates per name, not per value.
struct Points {
  struct Point {
    int64_t step = 0;
    double time = 0;
    size_t begin = 0, end = 0;  // its values: values[begin, end), each name at most once
  };
  std::vector<std::string> names;
  std::vector<Point> points;
  std::vector<NamedValue> values;

  size_t size() const { return points.size(); }
  bool empty() const { return points.empty(); }
  // Point i's values by name.
  std::map<std::string, double> ValuesOf(size_t i) const;
};

struct SpoolState {
  int64_t acked_points = 0;     // points of points.bin that W&B has (or that were dropped)
  int64_t acked_lines = 0;      // history lines W&B has: the next file_stream offset
  int64_t last_step = -1;       // the highest _step W&B has
  double runtime_base = 0;      // W&B runtime before this spool's first point (a resumed run)
  double start_time = 0;        // Unix time of this spool's first point
  bool finished = false;        // "complete" was accepted
  std::optional<int> exitcode;  // set once the dt run ended: the final post sends it
  std::map<std::string, double> summary;
};

struct SpoolMeta {
  RunMeta run;
  std::string base_url;
  std::string mode;  // online | offline
  std::string dt_run_id;
};

// The caller (the forwarder, under its W&B run's lock) serializes Stage, Flush, Append, state(), StateChanged,
// SaveState and Rebind. Read, Sync, FlushState and size take the spool's own short locks, so a
// worker reads points, syncs and writes state.json while the next batch is appended: no ingest
// waits for a post's body to be built or for an fsync.
class Spool {
 public:
  // Opens `dir`, creating it with `meta` when new; an existing spool keeps its meta.
  static absl::StatusOr<std::unique_ptr<Spool>> Open(const std::string& dir, const SpoolMeta& meta);
  // Opens an existing spool (after a restart).
  static absl::StatusOr<std::unique_ptr<Spool>> Load(const std::string& dir);
  ~Spool();

  const SpoolMeta& meta() const { return meta_; }
  SpoolState& state() { return state_; }
  // Points spooled (not records: a columns record holds many).
  int64_t size() const;
  // Bytes of points.bin after the last point W&B has accepted: what waits for W&B.
  int64_t unacked_bytes() const;

  // Adds the batch's points to what the next Flush writes: its columns as one record (serialized
  // as they arrived), each point of its map form as a record of its own. This runs for every
  // batch; staged points are not readable (size(), Read) until flushed.
  void Stage(const v1::MetricBatch& batch);
  // Writes what was staged in one write(2) (one per delivery pass, not one per batch: a tenth of
  // the coordinator's CPU under ingest was writes of single batches). A failed write is cut off
  // again (RESOURCE_EXHAUSTED), so the file stays whole records and the staged points are gone;
  // if that fails too, every later flush is DATA_LOSS until the spool is reopened (whose load
  // cuts the torn tail).
  absl::Status Flush();
  // Points and bytes staged and not yet flushed.
  int64_t staged_points() const { return staged_points_; }
  int64_t staged_bytes() const { return static_cast<int64_t>(staged_.size()); }
  // Stage, then Flush.
  absl::Status Append(const v1::MetricBatch& batch);
  // Up to `max_points` points starting at point index `from`, which may lie inside a record.
  // DATA_LOSS for a record that does not parse or whose columns disagree.
  absl::StatusOr<Points> Read(int64_t from, size_t max_points) const;
  // Takes the state as it is now for the next FlushState (a copy: cheap under the caller's lock).
  void StateChanged();
  // Writes the newest state taken to state.json (atomically, fsync) unless it was written
  // already; an older one never replaces a newer. Called without the caller's lock.
  absl::Status FlushState();
  // StateChanged, then FlushState.
  absl::Status SaveState();
  // The W&B run now belongs to another dt run (a new run of the same experiment): it is not
  // finished any more and ends when that run ends.
  absl::Status Rebind(const std::string& dt_run_id);
  // fdatasync of points.bin if anything was appended since the last sync, at most once a second
  // unless `force`.
  void Sync(bool force = false);

 private:
  Spool() = default;
  absl::Status OpenFiles();

  struct Record {
    int64_t offset = 0;       // of its length prefix in points.bin
    int64_t first_point = 0;  // index of its first point
  };
  // The record holding point `point` (< points_).
  size_t RecordOf(int64_t point) const ABSL_SHARED_LOCKS_REQUIRED(index_mu_);

  std::string dir_;
  SpoolMeta meta_;
  SpoolState state_;
  int fd_ = -1;
  bool unaligned_ = false;  // a failed append could not be cut off (under the caller's lock, as Append)
  // What Stage added and Flush writes (under the caller's lock, as Append): the records' bytes,
  // their index entries (offsets from the file's end when staging began), their points.
  std::string staged_;
  std::vector<Record> staged_records_;
  int64_t staged_from_bytes_ = 0, staged_from_points_ = 0, staged_points_ = 0;
  mutable absl::Mutex index_mu_;  // never held across a read, a write or a sync
  std::vector<Record> records_ ABSL_GUARDED_BY(index_mu_);
  int64_t points_ ABSL_GUARDED_BY(index_mu_) = 0;
  int64_t file_bytes_ ABSL_GUARDED_BY(index_mu_) = 0;
  bool dirty_ ABSL_GUARDED_BY(index_mu_) = false;
  int64_t last_sync_ns_ ABSL_GUARDED_BY(index_mu_) = 0;
  absl::Mutex save_mu_;                                   // held while state.json is written: one writer at a time
  uint64_t written_state_ ABSL_GUARDED_BY(save_mu_) = 0;  // the number of the state last written
  absl::Mutex taken_mu_ ABSL_ACQUIRED_AFTER(save_mu_);
  std::string taken_state_ ABSL_GUARDED_BY(taken_mu_);  // state.json's content as last taken
  uint64_t taken_number_ ABSL_GUARDED_BY(taken_mu_) = 0;
};

}  // namespace dt::wandb
