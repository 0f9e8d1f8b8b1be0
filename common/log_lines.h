// Every rank's output as one stream in time order (`dtctl logs --all`, the console's "all ranks"
// tail). A line's time is when its chunk reached the rank's log (the rank-<R>.log.times file
// dtslot keeps beside the log: "<the log's size after a chunk> <unix microseconds>" a line), else
// the ISO time the line starts with (dttrainer's log lines), else its predecessor's. Lines every
// rank printed alike can be folded into one ("[ranks 0-7] ...").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace dt {

struct TimedLine {
  int rank = 0;
  int64_t micros = 0;  // unix microseconds; 0: no time known
  std::string text;
};

// (the log's size after a chunk, unix microseconds), in the order written.
using ChunkTimes = std::vector<std::pair<int64_t, int64_t>>;

// The records of a times file's text (complete lines; malformed ones skipped).
ChunkTimes ParseLogTimes(absl::string_view text);
// The time a log line starts with ("2026-11-27T10:19:52.230Z ..."), if any.
std::optional<int64_t> LeadingIsoMicros(absl::string_view line);

struct TimingOptions {
  bool include_partial = false;  // a last line without its newline too
  bool stop_at_untimed = false;  // stop before a line no record or own time covers yet
};
// Times the lines of `text`, the log's bytes from `offset` on, appending them to `out`; a
// rank's lines never go back in time (`last_micros` carries the latest across calls). Returns
// the bytes consumed (whole lines).
size_t TimeLines(int rank, absl::string_view text, int64_t offset, const ChunkTimes& times,
                 const TimingOptions& options, int64_t* last_micros, std::vector<TimedLine>* out);

// Every rank's lines in one stream, in time order (a rank's own lines keep their order; equal
// times go by rank).
std::vector<TimedLine> MergeByTime(std::vector<std::vector<TimedLine>> per_rank);

struct PrintedLine {
  std::vector<int> ranks;  // one rank, or the ranks a folded line stands for
  std::string text;
};
// With `ranks` ranks in all: a line every rank printed, the same text within `window` lines of
// its first, becomes one line naming them (a line some ranks printed names those). Others pass
// through unchanged, in order.
std::vector<PrintedLine> FoldRepeated(const std::vector<TimedLine>& lines, int ranks, size_t window = 256);
// "[rank 3] text", "[ranks 0-7] text", "[ranks 0,2,5] text".
std::string FormatPrinted(const PrintedLine& line);

}  // namespace dt
