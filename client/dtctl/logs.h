// `dtctl logs RUN`: what the ranks printed (<exp dir>/logs/rank-<R>.log). One rank's log, every
// rank's one after another, or with --all one stream for all ranks in time order, each line
// prefixed [rank R]. A line's time is when its chunk reached the log (the rank-<R>.log.times file
// dtslot keeps for programs under dtrun), else the ISO time the line starts with (dttrainer's
// log lines), else its predecessor's. Lines every rank printed alike can be folded into one
// ("[ranks 0-7] ..."), and a regular expression (RE2) keeps only the lines it finds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/log_lines.h"

namespace dt::ctl {

// One rank's log, read as it grows: each Read returns the complete lines added since the last.
class RankLogReader {
 public:
  RankLogReader(int rank, std::string log_path);
  // The new complete lines (and, with `final`, a last line without its newline). A line whose
  // chunk time is not recorded yet waits for the next read unless `final`.
  std::vector<TimedLine> Read(bool final);
  bool seen() const { return seen_; }  // the log existed at some read

 private:
  int rank_;
  std::string log_path_;
  int64_t log_offset_ = 0;
  int64_t times_offset_ = 0;
  ChunkTimes times_;
  int64_t last_micros_ = 0;
  absl::Time waiting_since_ = absl::InfiniteFuture();  // a line has waited for its time since
  bool seen_ = false;
};

struct LogsQuery {
  std::string logs_dir;
  std::vector<int> ranks;
  bool all = false;     // one stream in time order
  bool fold = false;    // --all: fold lines every rank printed alike
  std::string grep;     // RE2; empty: every line
  bool follow = false;  // keep printing until `run_ended` says so
};

// Prints the query's lines to `out`. `run_ended` is asked between polls while following.
// INVALID_ARGUMENT for a bad --grep; NOT_FOUND when no rank's log exists.
absl::Status PrintLogs(const LogsQuery& query, const std::function<bool()>& run_ended, std::ostream& out);

}  // namespace dt::ctl
