// One W&B run's durable queue. Every metric point is appended to points.bin (length-prefixed
// dt.v1.MetricPoint records) before anything is sent (write(2) per batch, so a killed coordinator
// loses nothing; fdatasync about once a second against power loss). state.json records what W&B has accepted — points,
// history lines, last step — and is replaced atomically after each accepted post, so a restart resumes at the right
// offset and sends nothing twice. meta.json describes the W&B run.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/wandb/wandb_protocol.h"
#include "dt/v1/metrics.pb.h"

namespace dt::wandb {

struct Point {
  int64_t step = 0;
  double time = 0;
  std::map<std::string, double> values;
};

struct SpoolState {
  int64_t acked_points = 0;     // points of points.jsonl that W&B has (or that were dropped)
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

class Spool {
 public:
  // Opens `dir`, creating it with `meta` when new; an existing spool keeps its meta.
  static absl::StatusOr<std::unique_ptr<Spool>> Open(const std::string& dir, const SpoolMeta& meta);
  // Opens an existing spool (after a restart).
  static absl::StatusOr<std::unique_ptr<Spool>> Load(const std::string& dir);
  ~Spool();

  const SpoolMeta& meta() const { return meta_; }
  SpoolState& state() { return state_; }
  int64_t size() const { return static_cast<int64_t>(offsets_.size()); }
  // Bytes of points.bin after the last point W&B has accepted: what waits for W&B.
  int64_t unacked_bytes() const;

  // The batch's points (either form), each written as a MetricPoint record straight from the batch
  // (no Point or message built first): this runs for every batch.
  absl::Status Append(const v1::MetricBatch& batch);
  // Up to `max_points` points starting at point index `from`.
  absl::StatusOr<std::vector<Point>> Read(int64_t from, size_t max_points) const;
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

  std::string dir_;
  SpoolMeta meta_;
  SpoolState state_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;
  std::vector<int64_t> offsets_;  // byte offset of each point's record
  bool dirty_ = false;
  int64_t last_sync_ns_ = 0;
};

}  // namespace dt::wandb
