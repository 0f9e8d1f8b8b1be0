#include "coordinator/repeated_failures.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dt {
namespace {

// A message with each run of digits blanked to one '#': the same failure names other pids, ports
// and times each time, of other lengths too (pid 981, then pid 1010).
std::string WithoutNumbers(absl::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (char c : message) {
    bool digit = c >= '0' && c <= '9';
    if (!digit) {
      out.push_back(c);
    } else if (out.empty() || out.back() != '#') {
      out.push_back('#');
    }
  }
  return out;
}

// Any rank: when every rank fails the same way at start-up (a missing module, an unreadable
// file), which of them is reported first is a race between identical processes.
bool EndedEarlyTheSameWay(const v1::Failure& before, const v1::Failure& now) {
  bool kind = before.kind() == v1::Failure::REPORTED_ERROR || before.kind() == v1::Failure::PROCESS_EXITED;
  return kind && before.before_first_step() && before.exception_type() == now.exception_type() &&
         WithoutNumbers(before.message()) == WithoutNumbers(now.message());
}

}  // namespace

void MarkRepeatedHang(const std::vector<v1::Failure>& earlier, int allowed, v1::Failure& failure) {
  const std::string& signature = failure.verdict().odd_signature();
  if (signature.empty()) return;
  // The generations just before this one, newest first, each ended by a hang with the same odd
  // stack. Each generation's newest failure is the one compared; its older ones are passed over,
  // as are failures of this generation or later.
  std::vector<int64_t> generations;
  int64_t expect = failure.generation() - 1;
  for (auto it = earlier.rbegin(); it != earlier.rend(); ++it) {
    if (it->generation() != expect) {
      if (it->generation() > expect) continue;
      break;
    }
    if (it->kind() != v1::Failure::HANG || it->verdict().odd_signature() != signature) break;
    generations.push_back(it->generation());
    --expect;
  }
  if (static_cast<int>(generations.size()) < allowed) return;
  std::reverse(generations.begin(), generations.end());
  failure.set_kind(v1::Failure::HUNG_REPEATEDLY);
  failure.set_fatal(true);
  failure.set_message(absl::StrCat("generation ", failure.generation(), " hung the way generation",
                                   generations.size() == 1 ? " " : "s ", absl::StrJoin(generations, ", "),
                                   " did (the same odd stack; --max-identical-hangs ", allowed,
                                   "): restarting does not help, the run ends. ", failure.message()));
}

void MarkRepeatedEarlyFailure(const std::vector<v1::Failure>& earlier, v1::Failure& failure) {
  if (!failure.before_first_step()) return;
  for (auto it = earlier.rbegin(); it != earlier.rend(); ++it) {
    if (it->generation() >= failure.generation()) continue;
    if (it->generation() != failure.generation() - 1 || !EndedEarlyTheSameWay(*it, failure)) return;
    failure.set_fatal(true);
    absl::StrAppend(failure.mutable_message(), " [the same ", failure.exception_type(), " ended generation ",
                    it->generation(), " before its first step too (from rank ", it->rank(),
                    "): restarting cannot help, so the run ends]");
    return;
  }
}

}  // namespace dt
