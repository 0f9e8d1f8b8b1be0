#include "common/run_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dt {

std::string StateName(v1::RunState state) { return v1::RunState_Name(state); }

int WorldSize(const v1::RunSpec& spec) { return spec.nodes() * spec.procs_per_node(); }

int MostRanks(const v1::Run& run) { return std::max(run.world_size(), WorldSize(run.spec())); }

bool IsTerminal(v1::RunState state) { return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED; }

std::string DescribeFailure(const v1::Failure& f) {
  if (f.kind() == v1::Failure::KIND_UNSPECIFIED && f.message().empty()) return "";
  std::string who;
  if (f.rank() >= 0) {
    who = absl::StrCat("rank ", f.rank());
    if (!f.node().empty() || !f.host().empty()) {
      absl::StrAppend(&who, " (node ", f.node().empty() ? "?" : f.node(), ", host ", f.host().empty() ? "?" : f.host(),
                      ")");
    }
    absl::StrAppend(&who, " ");
  }
  std::string what;
  switch (f.kind()) {
    case v1::Failure::REPORTED_ERROR:
      what = absl::StrCat(who, "failed at step ", f.step(), ": ",
                          f.exception_type().empty() ? "" : absl::StrCat(f.exception_type(), ": "), f.message());
      break;
    case v1::Failure::PROCESS_EXITED:
      what = absl::StrCat(who, "exited: ", f.message());
      break;
    default:
      what = absl::StrCat(who, f.message());
  }
  if (f.fatal() && f.kind() != v1::Failure::HUNG_REPEATEDLY && !f.before_first_step()) {
    absl::StrAppend(&what, " (not restarted: the trainer reported that a restart cannot help)");
  }
  return what;
}

}  // namespace dt
