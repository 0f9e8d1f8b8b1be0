#include "client/dtctl/logs.h"

#include <re2/re2.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fs.h"

namespace dt::ctl {
namespace {

// A line whose chunk has no time yet waits this long for it, then takes its predecessor's.
constexpr absl::Duration kTimeWait = absl::Seconds(2);

// The bytes of `path` from `offset` on ("" when it cannot be read).
std::string ReadFrom(const std::string& path, int64_t offset, bool* exists) {
  std::ifstream in(path, std::ios::binary);
  *exists = static_cast<bool>(in);
  if (!in) return "";
  in.seekg(offset);
  std::ostringstream rest;
  rest << in.rdbuf();
  return rest.str();
}

}  // namespace

RankLogReader::RankLogReader(int rank, std::string log_path) : rank_(rank), log_path_(std::move(log_path)) {}

std::vector<TimedLine> RankLogReader::Read(bool final) {
  bool times_exist = false;
  std::string times_text = ReadFrom(log_path_ + ".times", times_offset_, &times_exist);
  size_t complete = times_text.rfind('\n');
  if (complete != std::string::npos) {
    ChunkTimes added = ParseLogTimes(absl::string_view(times_text).substr(0, complete + 1));
    times_.insert(times_.end(), added.begin(), added.end());
    times_offset_ += static_cast<int64_t>(complete + 1);
  }
  bool log_exists = false;
  std::string text = ReadFrom(log_path_, log_offset_, &log_exists);
  seen_ = seen_ || log_exists;
  std::vector<TimedLine> lines;
  TimingOptions options;
  options.include_partial = final;
  // A line's chunk time is on its way (dtslot writes the log first): wait a little for it.
  options.stop_at_untimed = times_exist && !final && absl::Now() - waiting_since_ < kTimeWait;
  size_t used = TimeLines(rank_, text, log_offset_, times_, options, &last_micros_, &lines);
  size_t whole = final ? text.size() : text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (used < whole) {
    if (waiting_since_ == absl::InfiniteFuture()) waiting_since_ = absl::Now();
  } else {
    waiting_since_ = absl::InfiniteFuture();
  }
  log_offset_ += static_cast<int64_t>(used);
  // Records of bytes already read are spent.
  times_.erase(times_.begin(),
               std::lower_bound(times_.begin(), times_.end(), log_offset_ + 1,
                                [](const std::pair<int64_t, int64_t>& a, int64_t b) { return a.first < b; }));
  return lines;
}

absl::Status PrintLogs(const LogsQuery& q, const std::function<bool()>& run_ended, std::ostream& out) {
  std::unique_ptr<re2::RE2> pattern;
  if (!q.grep.empty()) {
    pattern = std::make_unique<re2::RE2>(q.grep, re2::RE2::Quiet);
    if (!pattern->ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grep ", q.grep, " is not a regular expression (RE2 syntax): ", pattern->error()));
    }
  }
  std::vector<RankLogReader> readers;
  for (int rank : q.ranks) readers.emplace_back(rank, JoinPath(q.logs_dir, absl::StrCat("rank-", rank, ".log")));
  auto keep = [&](const TimedLine& l) { return pattern == nullptr || re2::RE2::PartialMatch(l.text, *pattern); };
  auto pass = [&](bool final) {
    std::vector<std::vector<TimedLine>> per_rank;
    for (RankLogReader& r : readers) {
      std::vector<TimedLine> lines = r.Read(final);
      lines.erase(std::remove_if(lines.begin(), lines.end(), [&](const TimedLine& l) { return !keep(l); }),
                  lines.end());
      if (!q.all) {
        for (const TimedLine& l : lines)
          out << (q.ranks.size() > 1 ? FormatPrinted({{l.rank}, l.text}) : l.text) << "\n";
        continue;
      }
      per_rank.push_back(std::move(lines));
    }
    if (q.all) {
      std::vector<TimedLine> merged = MergeByTime(std::move(per_rank));
      if (q.fold) {
        for (const PrintedLine& p : FoldRepeated(merged, static_cast<int>(q.ranks.size())))
          out << FormatPrinted(p) << "\n";
      } else {
        for (const TimedLine& l : merged) out << FormatPrinted({{l.rank}, l.text}) << "\n";
      }
    }
    out.flush();
  };
  while (q.follow) {
    pass(false);
    if (run_ended()) break;
    absl::SleepFor(absl::Milliseconds(300));
  }
  pass(true);  // the last lines, a last one without its newline included
  bool any = std::any_of(readers.begin(), readers.end(), [](const RankLogReader& r) { return r.seen(); });
  if (!any) {
    return absl::NotFoundError(
        absl::StrCat("no logs in ", q.logs_dir, " yet (ranks write rank-<R>.log there once started)"));
  }
  return absl::OkStatus();
}

}  // namespace dt::ctl
