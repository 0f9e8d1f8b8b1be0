#include "client/dtctl/output.h"

#include "common/run_state.h"
#include "common/utf8.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dt::ctl {

std::string HumanSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string Ago(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "";
  double secs = absl::ToDoubleSeconds(absl::Now() - absl::FromUnixSeconds(t.seconds()));
  return absl::StrCat(HumanSeconds(std::max(0.0, secs)), " ago");
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string FailureLine(const v1::Failure& f) {
  // The message and type come from the run's processes: escaped, they cannot drive the terminal.
  return PrintableForTerminal(DescribeFailure(f));
}

std::string VerdictLines(const v1::HangVerdict& v) {
  std::string out = absl::StrCat("stacks     ", v.summary(), "\n");
  for (const v1::StackGroup& g : v.groups()) {
    std::vector<std::string> ranks;
    for (int r : g.ranks()) ranks.push_back(absl::StrCat(r));
    absl::StrAppend(&out, "           ", g.odd() ? "odd one out: " : "", g.ranks_size() == 1 ? "rank " : "ranks ",
                    absl::StrJoin(ranks, ", "), "\n");
    int n = 0;
    for (const v1::StackFrame& f : g.frames()) {
      if (n == 8) {
        absl::StrAppend(&out, "             … ", g.frames_size() - n, " more (dtctl stacks)\n");
        break;
      }
      absl::StrAppend(
          &out, "             #", n++, " ", f.function(),
          f.file().empty() ? "" : absl::StrCat(" (", f.file(), f.line() > 0 ? absl::StrCat(":", f.line()) : "", ")"),
          "\n");
    }
  }
  return PrintableForTerminal(out);
}

std::string PreflightCell(const v1::RankStatus& rank) {
  if (!rank.has_preflight()) return "";
  const v1::DevicePreflight& p = rank.preflight();
  if (!p.error().empty()) return "device error";
  return absl::StrFormat("%.1f ms", p.matmul_seconds() * 1e3);
}

std::string Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      out += cells[i];
      if (i + 1 < cells.size()) out += std::string(width[i] - cells[i].size() + 2, ' ');
    }
    out += '\n';
  };
  line(header);
  for (const auto& row : rows) line(row);
  return out;
}

}  // namespace dt::ctl
