// What every benchmark shares: summary statistics, the quick/full switch, and reporting results
// (a table on stdout, JSON lines for scripts/bench.sh) as ratios against an anchor measured in
// the same run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dt::bench {

struct Summary {
  size_t n = 0;
  double min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};
Summary Summarize(std::vector<double> samples);

// DT_BENCH_QUICK=1 (scripts/bench.sh --quick): fewer repeats, smaller sizes.
bool Quick();

// Appends to `seconds` the time `dd if=/dev/zero bs=4M count=BLOCKS conv=fsync` takes to write
// `path`, removed afterwards: the checkpoint rows' anchor, the same bytes through the page cache
// onto the disk.
absl::Status TimeDd(const std::string& path, int64_t blocks, std::vector<double>& seconds);

// Whether round `round` (from 1) of a checkpoint benchmark times its `dd` before the round rather
// than after it. This virtual disk's speed drifts by up to 2x within seconds, and whatever runs
// right after a large write and delete is the slower: the two take turns going first (round, dd,
// dd, round, ...), so that neither is always measured after the other.
bool DdGoesFirst(int round);

struct Result {
  std::string name;  // what was measured
  double value = 0;  // dt's figure
  std::string unit;
  std::string anchor;       // what it is compared with
  double anchor_value = 0;  // the anchor's figure, same run, same machine
  std::string goal;         // e.g. "<= 1.5x" (ratio = value / anchor_value)
  bool higher_is_better = false;
  double goal_ratio = 0;  // the ratio the goal allows (0: no goal)
};

// Prints the result and appends it as JSON to $DT_BENCH_OUT (one object per line). `met`: for an
// absolute goal (e.g. "<= 2 s"), whether the benchmark met it.
void Report(const Result& r, std::optional<bool> met = std::nullopt);

// The median time, in microseconds, of a one-byte round trip through two pipes: between two
// processes (each end wakes the other: what a wake-up costs on this machine) or, with
// `two_processes` false, written and read back by one thread (the same system calls, no wake-up).
double PipeRoundTripMicros(bool two_processes, int round_trips);

// A temporary directory removed at exit.
std::string TempDir(const std::string& tag);
// Leaves `dir` (one TempDir made) in place at exit: a failed part's evidence.
void KeepTempDir(const std::string& dir);

// A one-line file's text without its newline (dtcoord's address and admin token files); "" when
// it cannot be read.
std::string ReadLine(const std::string& path);

}  // namespace dt::bench
