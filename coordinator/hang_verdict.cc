#include "coordinator/hang_verdict.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/proto_time.h"

namespace dt {
namespace {

// Frames that show a thread waiting for its peers in a collective (Python: torch.distributed's
// functions; native: c10d, Gloo, NCCL).
bool IsCollectiveWait(const v1::StackFrame& f) {
  std::string fn = absl::AsciiStrToLower(f.function());
  for (absl::string_view word : {"all_reduce", "allreduce", "broadcast", "barrier", "all_gather", "allgather",
                                 "reduce_scatter", "alltoall", "all_to_all", "gloo::", "nccl", "c10d::"}) {
    if (absl::StrContains(fn, word)) return true;
  }
  return absl::StrContains(f.file(), "torch/distributed/");
}

bool IsSystemModule(absl::string_view module) {
  for (absl::string_view lib : {"/libc.so", "/libpthread.so", "/ld-linux", "/libstdc++.so", "/libgcc_s.so"}) {
    if (absl::StrContains(module, lib)) return true;
  }
  return false;
}

// "load_batch (train.py:12)": the innermost frame that is the program's own (not libc's).
std::string DescribeTop(const v1::ThreadStack& thread) {
  for (const v1::StackFrame& f : thread.frames()) {
    if (f.function() == "??" || IsSystemModule(f.module())) continue;
    std::string where =
        f.file().empty() ? ""
                         : absl::StrCat(" (", Basename(f.file()), f.line() > 0 ? absl::StrCat(":", f.line()) : "", ")");
    return absl::StrCat(f.function(), where);
  }
  return thread.frames().empty() ? "no frames" : thread.frames(0).function();
}

struct CollectiveState {
  int64_t last_finished = 0;  // 0: none
  std::string last_finished_op;
  std::optional<v1::CollectiveRecord> waiting;  // the oldest one not ended
};

CollectiveState StateOf(const v1::RankStacks& rank) {
  CollectiveState s;
  for (const v1::CollectiveRecord& c : rank.collectives()) {
    if (c.has_ended()) {
      if (c.sequence() > s.last_finished) {
        s.last_finished = c.sequence();
        s.last_finished_op = c.op();
      }
    } else if (!s.waiting || c.sequence() < s.waiting->sequence()) {
      s.waiting = c;
    }
  }
  return s;
}

// "ranks 0-6 wait in all-reduce #1042 (started 41 s ago); rank 7 last finished #1041": the ranks
// that never reached the collective the others wait in are behind. Empty without rings.
std::string JudgeCollectives(const std::vector<v1::RankStacks>& ranks, absl::Time now, std::vector<int>* behind) {
  std::map<int, CollectiveState> states;
  for (const v1::RankStacks& r : ranks) {
    if (!r.collectives().empty()) states[r.rank()] = StateOf(r);
  }
  if (states.empty()) return "";
  int64_t frontier = 0;
  for (const auto& [rank, s] : states) {
    if (s.waiting) frontier = std::max(frontier, s.waiting->sequence());
  }
  if (frontier == 0) return "no rank waits in a collective";
  std::vector<int> waiting;
  std::map<int64_t, std::vector<int>> behind_at;  // last finished → ranks
  absl::Time started = absl::InfiniteFuture();
  std::string op;
  for (const auto& [rank, s] : states) {
    if (s.waiting && s.waiting->sequence() == frontier) {
      waiting.push_back(rank);
      started = std::min(started, FromProtoTime(s.waiting->started()));
      op = s.waiting->op();
    } else if (s.last_finished < frontier) {
      behind_at[s.last_finished].push_back(rank);
      behind->push_back(rank);
    }
  }
  std::string out = absl::StrCat(waiting.size() == 1 ? "rank " : "ranks ", RankList(waiting), " wait",
                                 waiting.size() == 1 ? "s" : "", " in ", op, " #", frontier, " (started ",
                                 absl::FormatDuration(absl::Trunc(now - started, absl::Seconds(1))), " ago)");
  for (const auto& [last, rs] : behind_at) {
    absl::StrAppend(&out, "; ", rs.size() == 1 ? "rank " : "ranks ", RankList(rs),
                    last == 0 ? " finished no collective yet" : absl::StrCat(" last finished #", last));
  }
  return out;
}

// The ranks that share a main stack, largest group first (ties: the lowest rank first).
struct RankGroup {
  std::string signature;
  std::vector<int> ranks;
  const v1::ThreadStack* stack = nullptr;  // null: the rank's capture failed (`error` says why)
  std::string error;
};

std::vector<RankGroup> GroupByStack(const std::vector<v1::RankStacks>& ranks) {
  std::vector<RankGroup> groups;
  for (const v1::RankStacks& r : ranks) {
    const v1::ThreadStack* stack = MainStack(r);
    std::string error = r.error();
    if (stack == nullptr && error.empty()) {
      for (const v1::ProcessStacks& p : r.processes()) {
        if (!p.error().empty()) error = p.error();
      }
    }
    std::string signature = stack != nullptr ? StackSignature(*stack) : absl::StrCat("(no stacks: ", error, ")");
    auto it = std::find_if(groups.begin(), groups.end(), [&](const RankGroup& g) { return g.signature == signature; });
    if (it == groups.end()) {
      groups.push_back({signature, {}, stack, error});
      it = groups.end() - 1;
    }
    it->ranks.push_back(r.rank());
  }
  std::sort(groups.begin(), groups.end(), [](const RankGroup& a, const RankGroup& b) {
    return a.ranks.size() != b.ranks.size()
               ? a.ranks.size() > b.ranks.size()
               : *std::min_element(a.ranks.begin(), a.ranks.end()) < *std::min_element(b.ranks.begin(), b.ranks.end());
  });
  return groups;
}

// Which groups are odd: those holding a rank behind in the collectives; without rings, the groups
// not waiting in a collective while others do; else a group strictly smaller than every other.
std::vector<bool> OddGroups(const std::vector<RankGroup>& groups, const std::vector<int>& behind) {
  std::vector<bool> odd(groups.size(), false);
  if (!behind.empty()) {
    for (size_t g = 0; g < groups.size(); ++g) {
      for (int r : groups[g].ranks) odd[g] = odd[g] || std::find(behind.begin(), behind.end(), r) != behind.end();
    }
    return odd;
  }
  if (groups.size() < 2) return odd;
  std::vector<bool> waits(groups.size(), false);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].stack != nullptr) {
      for (const v1::StackFrame& f : groups[g].stack->frames()) waits[g] = waits[g] || IsCollectiveWait(f);
    }
  }
  size_t waiting = std::count(waits.begin(), waits.end(), true);
  if (waiting > 0 && waiting < groups.size()) {
    for (size_t g = 0; g < groups.size(); ++g) odd[g] = !waits[g];
  } else if (groups.back().ranks.size() < groups[groups.size() - 2].ranks.size()) {
    odd.back() = true;
  }
  return odd;
}

// The verdict's groups, odd ranks and signature, and the sentence a person reads first.
void WriteGroupsAndSummary(const std::vector<RankGroup>& groups, const std::vector<bool>& odd,
                           v1::HangVerdict* verdict) {
  std::vector<std::string> odd_signatures;
  std::vector<std::string> odd_text, others_text;
  for (size_t g = 0; g < groups.size(); ++g) {
    v1::StackGroup* out = verdict->add_groups();
    out->set_signature(groups[g].signature);
    for (int r : groups[g].ranks) out->add_ranks(r);
    if (groups[g].stack != nullptr) *out->mutable_frames() = groups[g].stack->frames();
    out->set_odd(odd[g]);
    std::string where = groups[g].stack != nullptr ? absl::StrCat("in ", DescribeTop(*groups[g].stack))
                                                   : absl::StrCat("without stacks (", groups[g].error, ")");
    std::string text =
        absl::StrCat(groups[g].ranks.size() == 1 ? "rank " : "ranks ", RankList(groups[g].ranks), " ", where);
    if (odd[g]) {
      for (int r : groups[g].ranks) verdict->add_odd_ranks(r);
      odd_signatures.push_back(groups[g].signature);
      odd_text.push_back(text);
    } else {
      others_text.push_back(text);
    }
  }
  std::sort(odd_signatures.begin(), odd_signatures.end());
  verdict->set_odd_signature(absl::StrJoin(odd_signatures, " | "));
  std::string summary;
  if (groups.empty()) {
    summary = "no rank's stacks arrived";
  } else if (!odd_text.empty()) {
    summary = absl::StrCat(
        absl::StrJoin(odd_text, "; "),
        odd_text.size() == 1 && verdict->odd_ranks_size() == 1 ? " is the odd one out" : " are the odd ones out",
        others_text.empty() ? "" : absl::StrCat("; ", absl::StrJoin(others_text, "; ")));
  } else if (groups.size() == 1) {
    summary = absl::StrCat("every rank that answered shows the same stack: ", others_text.front());
  } else {
    summary = absl::StrCat("the ranks' stacks differ and no group stands out: ", absl::StrJoin(others_text, "; "));
  }
  if (!verdict->collectives().empty()) absl::StrAppend(&summary, ". Collectives: ", verdict->collectives());
  if (!verdict->missing_ranks().empty()) {
    std::vector<int> missing(verdict->missing_ranks().begin(), verdict->missing_ranks().end());
    absl::StrAppend(&summary, ". No stacks from ", missing.size() == 1 ? "rank " : "ranks ", RankList(missing));
  }
  verdict->set_summary(summary);
}

}  // namespace

const v1::ThreadStack* MainStack(const v1::RankStacks& rank) {
  const v1::ProcessStacks* program = nullptr;
  for (const v1::ProcessStacks& p : rank.processes()) {
    if (p.threads().empty()) continue;
    if (program == nullptr || (p.kind() == "python" && program->kind() != "python")) program = &p;
  }
  if (program == nullptr) return nullptr;
  for (const v1::ThreadStack& t : program->threads()) {
    if (t.main()) return &t;
  }
  return &program->threads(0);
}

std::string StackSignature(const v1::ThreadStack& thread) {
  std::vector<std::string> parts;
  for (const v1::StackFrame& f : thread.frames()) {
    parts.push_back(f.file().empty() ? f.function()
                                     : absl::StrCat(f.function(), "@", Basename(f.file()), ":", f.line()));
  }
  return absl::StrJoin(parts, " < ");
}

std::string RankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (size_t k = 0; k < ranks.size();) {
    size_t end = k;
    while (end + 1 < ranks.size() && ranks[end + 1] == ranks[end] + 1) ++end;
    parts.push_back(end == k ? absl::StrCat(ranks[k]) : absl::StrCat(ranks[k], "-", ranks[end]));
    k = end + 1;
  }
  return absl::StrJoin(parts, ", ");
}

v1::HangVerdict JudgeHang(const std::vector<v1::RankStacks>& ranks, int world_size, absl::Time now) {
  v1::HangVerdict verdict;
  std::vector<RankGroup> groups = GroupByStack(ranks);
  std::vector<bool> answered(std::max(world_size, 0), false);
  for (const v1::RankStacks& r : ranks) {
    if (r.rank() >= 0 && r.rank() < world_size) answered[r.rank()] = true;
  }
  for (int k = 0; k < world_size; ++k) {
    if (!answered[k]) verdict.add_missing_ranks(k);
  }
  std::vector<int> behind;
  verdict.set_collectives(JudgeCollectives(ranks, now, &behind));
  WriteGroupsAndSummary(groups, OddGroups(groups, behind), &verdict);
  return verdict;
}

}  // namespace dt
