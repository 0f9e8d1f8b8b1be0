#include "client/dtctl/srun_report.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/host.h"
#include "common/names.h"
#include "common/utf8.h"

namespace dt::ctl {
namespace {

constexpr absl::string_view kErrorPrefix = "srun: error: ";
// srun's lines are short; a longer one is not worth sending whole (and bytes that are not UTF-8,
// from a task's name or a locale, are repaired: the coordinator stores only valid UTF-8).
constexpr size_t kMaxReportBytes = 4096;

// "1" or "0-2,5" → the ids; false on anything else.
bool ParseTaskList(absl::string_view list, std::vector<int>* out) {
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(range.first, &first) || first < 0) return false;
    last = first;
    if (!range.second.empty() && (!absl::SimpleAtoi(range.second, &last) || last < first || last - first > 65536)) {
      return false;
    }
    for (int t = first; t <= last; ++t) out->push_back(t);
  }
  return !out->empty();
}

std::optional<SrunTaskEnd> ParseTaskEnd(absl::string_view line) {
  absl::string_view rest = line;
  if (!absl::ConsumePrefix(&rest, kErrorPrefix)) return std::nullopt;
  // NODES: task(s) LIST: WHAT — WHAT may itself contain ": ".
  std::vector<absl::string_view> parts = absl::StrSplit(rest, absl::MaxSplits(": ", 2));
  if (parts.size() != 3) return std::nullopt;
  absl::string_view tasks = parts[1];
  if (!absl::ConsumePrefix(&tasks, "tasks ") && !absl::ConsumePrefix(&tasks, "task ")) return std::nullopt;
  SrunTaskEnd end;
  if (!ParseTaskList(tasks, &end.tasks)) return std::nullopt;
  end.nodes = std::string(parts[0]);
  end.what = std::string(absl::StripAsciiWhitespace(parts[2]));
  end.line = std::string(line);
  return end;
}

}  // namespace

std::vector<SrunTaskEnd> ParseSrunTaskEnds(const std::string& srun_stderr) {
  std::vector<SrunTaskEnd> out;
  for (absl::string_view line : absl::StrSplit(srun_stderr, '\n')) {
    if (std::optional<SrunTaskEnd> end = ParseTaskEnd(absl::StripTrailingAsciiWhitespace(line))) {
      out.push_back(std::move(*end));
    }
  }
  return out;
}

std::string LastSrunError(const std::string& srun_stderr) {
  std::string last;
  for (absl::string_view line : absl::StrSplit(srun_stderr, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    if (absl::StartsWith(line, kErrorPrefix) && !ParseTaskEnd(line)) last = std::string(line);
  }
  return last;
}

std::optional<v1::ReportErrorRequest> StepFailureReport(const std::string& run_id, int64_t generation, int exit_code,
                                                        const std::string& srun_stderr, const std::string& batch_node) {
  if (exit_code == 0) return std::nullopt;
  v1::ReportErrorRequest report;
  report.set_run_id(run_id);
  report.set_generation(generation);
  report.set_rank(-1);
  report.set_process_exited(true);
  std::vector<SrunTaskEnd> ends = ParseSrunTaskEnds(srun_stderr);
  if (!ends.empty()) {
    const SrunTaskEnd& first = ends.front();
    report.set_scheduler_task(first.tasks.front());
    // A host list ("n[1-2]") names no one node; the task id alone then finds the rank.
    bool one_node = first.nodes.find_first_of("[,") == std::string::npos;
    if (one_node && ValidateLabel("node", first.nodes).ok()) report.set_node(first.nodes);
    report.set_message(
        TruncateUtf8(absl::StrCat("srun: task ", first.tasks.front(), " on ", first.nodes, ": ", first.what,
                                  " (the first task of the step to end badly; srun ended with code ", exit_code, ")"),
                     kMaxReportBytes));
    return report;
  }
  std::string error = LastSrunError(srun_stderr);
  report.set_node(batch_node);
  report.set_host(HostName());
  report.set_local_slot(-1);  // srun itself, not one of its tasks
  report.set_message(
      TruncateUtf8(absl::StrCat("srun ended with code ", exit_code, " before any task of the step failed",
                                error.empty() ? "" : absl::StrCat(": ", error)),
                   kMaxReportBytes));
  return report;
}

}  // namespace dt::ctl
