// What a hung generation's stacks say: which ranks share a stack, which group is the odd one out
// (the probable cause: the others wait for it), and — from dttrainer's rings of collectives — who
// is behind: "ranks 0-6 wait in all-reduce #1042 (started 41 s ago); rank 7 last finished #1041".
// Pure: the ranks' captures in, the verdict out.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "dt/v1/stacks.pb.h"

namespace dt {

// The ranks' captures (any order; ranks that did not answer are absent) of a world of
// `world_size`, judged at `now`.
v1::HangVerdict JudgeHang(const std::vector<v1::RankStacks>& ranks, int world_size, absl::Time now);

// The stack a rank is judged by: the main thread of its program (its Python process's when it has
// one, else its first process's). Null when the capture holds no frames.
const v1::ThreadStack* MainStack(const v1::RankStacks& rank);

// The signature of a stack: its frames' functions (with file:line where known), no addresses.
std::string StackSignature(const v1::ThreadStack& thread);

// "0, 2-5, 7".
std::string RankList(std::vector<int> ranks);

}  // namespace dt
