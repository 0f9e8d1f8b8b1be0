#include "common/log_lines.h"

#include <algorithm>
#include <deque>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace dt {

ChunkTimes ParseLogTimes(absl::string_view text) {
  ChunkTimes out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> f = absl::StrSplit(line, ' ');
    int64_t bytes = 0, micros = 0;
    if (absl::SimpleAtoi(f.first, &bytes) && absl::SimpleAtoi(f.second, &micros)) out.emplace_back(bytes, micros);
  }
  return out;
}

std::optional<int64_t> LeadingIsoMicros(absl::string_view line) {
  size_t space = line.find(' ');
  if (space < 20 || space > 32 || line[4] != '-' || line[10] != 'T') return std::nullopt;
  absl::Time t;
  std::string error;
  if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", line.substr(0, space), &t, &error)) return std::nullopt;
  return absl::ToUnixMicros(t);
}

size_t TimeLines(int rank, absl::string_view text, int64_t offset, const ChunkTimes& times,
                 const TimingOptions& options, int64_t* last_micros, std::vector<TimedLine>* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t newline = text.find('\n', pos);
    if (newline == absl::string_view::npos && !options.include_partial) break;
    size_t line_end = newline == absl::string_view::npos ? text.size() : newline;
    size_t next = newline == absl::string_view::npos ? text.size() : newline + 1;
    absl::string_view line = text.substr(pos, line_end - pos);
    int64_t end = offset + static_cast<int64_t>(next);
    std::optional<int64_t> micros = LeadingIsoMicros(line);
    if (!micros) {
      // The first chunk that ended at or after the line's end brought it.
      auto chunk = std::lower_bound(times.begin(), times.end(), end,
                                    [](const std::pair<int64_t, int64_t>& a, int64_t b) { return a.first < b; });
      if (chunk != times.end()) {
        micros = chunk->second;
      } else if (options.stop_at_untimed) {
        break;
      }
    }
    *last_micros = std::max(*last_micros, micros.value_or(*last_micros));
    out->push_back({rank, *last_micros, std::string(line)});
    pos = next;
  }
  return pos;
}

std::vector<TimedLine> MergeByTime(std::vector<std::vector<TimedLine>> per_rank) {
  std::vector<TimedLine> all;
  for (auto& lines : per_rank) {
    for (auto& l : lines) all.push_back(std::move(l));
  }
  std::stable_sort(all.begin(), all.end(), [](const TimedLine& a, const TimedLine& b) {
    return a.micros != b.micros ? a.micros < b.micros : a.rank < b.rank;
  });
  return all;
}

std::vector<PrintedLine> FoldRepeated(const std::vector<TimedLine>& lines, int ranks, size_t window) {
  struct Entry {
    PrintedLine line;
    size_t index;
  };
  std::vector<PrintedLine> out;
  std::deque<Entry> queue;                         // in order of first appearance
  std::map<std::string, std::deque<Entry*>> open;  // text → its entries still gathering ranks
  auto complete = [&](const Entry& e, size_t now) {
    return static_cast<int>(e.line.ranks.size()) >= ranks || now - e.index > window;
  };
  auto emit_ready = [&](size_t now, bool all) {
    while (!queue.empty() && (all || complete(queue.front(), now))) {
      Entry& e = queue.front();
      auto group = open.find(e.line.text);
      if (group != open.end()) {
        auto& entries = group->second;
        entries.erase(std::remove(entries.begin(), entries.end(), &e), entries.end());
        if (entries.empty()) open.erase(group);
      }
      std::sort(e.line.ranks.begin(), e.line.ranks.end());
      out.push_back(std::move(e.line));
      queue.pop_front();
    }
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const TimedLine& l = lines[i];
    Entry* joined = nullptr;
    auto group = open.find(l.text);
    if (group != open.end()) {
      for (Entry* e : group->second) {
        if (i - e->index <= window &&
            std::find(e->line.ranks.begin(), e->line.ranks.end(), l.rank) == e->line.ranks.end()) {
          joined = e;
          break;
        }
      }
    }
    if (joined != nullptr) {
      joined->line.ranks.push_back(l.rank);
    } else {
      queue.push_back({{{l.rank}, l.text}, i});
      open[l.text].push_back(&queue.back());
    }
    emit_ready(i, false);
  }
  emit_ready(lines.size(), true);
  return out;
}

std::string FormatPrinted(const PrintedLine& line) {
  const std::vector<int>& r = line.ranks;
  if (r.size() == 1) return absl::StrCat("[rank ", r[0], "] ", line.text);
  bool contiguous = r.back() - r.front() + 1 == static_cast<int>(r.size());
  std::string which = contiguous ? absl::StrCat(r.front(), "-", r.back()) : absl::StrJoin(r, ",");
  return absl::StrCat("[ranks ", which, "] ", line.text);
}

}  // namespace dt
