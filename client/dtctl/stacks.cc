#include "client/dtctl/stacks.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/proto_time.h"
#include "common/run_json.h"
#include "common/run_state.h"
#include "common/stack_capture.h"
#include "common/utf8.h"

namespace dt::ctl {
namespace {

// A live capture waits for every rank: a heartbeat interval to ask, the capture, the answers.
constexpr absl::Duration kLiveCaptureTimeout = absl::Seconds(60);

std::string RankWord(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (int r : ranks) parts.push_back(absl::StrCat(r));
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(parts, ", "));
}

v1::StackCapture OnlyRank(v1::StackCapture c, std::optional<int> rank) {
  if (!rank) return c;
  auto* ranks = c.mutable_ranks();
  for (int k = ranks->size() - 1; k >= 0; --k) {
    if (ranks->Get(k).rank() != *rank) ranks->DeleteSubrange(k, 1);
  }
  return c;
}

}  // namespace

absl::StatusOr<std::vector<v1::StackCapture>> FetchStacks(CoordinatorClient& client, const StacksQuery& q) {
  v1::GetRunRequest get;
  get.set_run_id(q.run_id);
  absl::StatusOr<v1::Run> run = Call(client, &v1::RunService::Stub::GetRun, client.runs(), get, absl::Seconds(30));
  if (!run.ok()) return run.status();
  if (q.rank && (*q.rank < 0 || (run->world_size() > 0 && *q.rank >= run->world_size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank ", *q.rank, " is outside 0..", run->world_size() - 1, " of run ", q.run_id));
  }
  bool live = !q.stored && !q.generation && run->state() == v1::RUNNING;
  if (live) {
    v1::CaptureStacksRequest req;
    req.set_run_id(q.run_id);
    absl::StatusOr<v1::StackCapture> c =
        Call(client, &v1::StacksService::Stub::CaptureStacks, client.stacks(), req, kLiveCaptureTimeout);
    if (!c.ok()) return c.status();
    return std::vector<v1::StackCapture>{*c};
  }
  v1::GetStacksRequest req;
  req.set_run_id(q.run_id);
  if (q.generation) req.set_generation(*q.generation);
  absl::StatusOr<v1::GetStacksResponse> got =
      Call(client, &v1::StacksService::Stub::GetStacks, client.stacks(), req, absl::Seconds(30));
  if (!got.ok()) return got.status();
  return std::vector<v1::StackCapture>(got->captures().begin(), got->captures().end());
}

std::string FormatCaptures(const std::vector<v1::StackCapture>& captures, std::optional<int> rank) {
  std::string out;
  for (const v1::StackCapture& whole : captures) {
    v1::StackCapture c = OnlyRank(whole, rank);
    absl::StrAppend(&out, "capture ", c.capture_id(), " of generation ", c.generation(), ", ",
                    Iso8601(c.requested_at()), c.live() ? " (live: the run went on)" : "", "\n", "reason   ",
                    c.reason(), "\n", "verdict  ", c.verdict().summary(), "\n");
    for (const v1::StackGroup& g : c.verdict().groups()) {
      std::vector<int> ranks(g.ranks().begin(), g.ranks().end());
      v1::ThreadStack t;
      *t.mutable_frames() = g.frames();
      absl::StrAppend(&out, "\n", g.odd() ? "odd one out: " : "", RankWord(ranks), "\n", FormatFrames(t, 12));
    }
    absl::StrAppend(&out, "\n");
    for (const v1::RankStacks& r : c.ranks()) absl::StrAppend(&out, FormatRankStacks(r), "\n");
  }
  return PrintableForTerminal(out);
}

nlohmann::json CapturesJson(const std::vector<v1::StackCapture>& captures, std::optional<int> rank) {
  nlohmann::json all = nlohmann::json::array();
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  for (const v1::StackCapture& c : captures) {
    std::string text;
    (void)google::protobuf::util::MessageToJsonString(OnlyRank(c, rank), &text, options);
    all.push_back(nlohmann::json::parse(text, nullptr, false));
  }
  return all;
}

}  // namespace dt::ctl
