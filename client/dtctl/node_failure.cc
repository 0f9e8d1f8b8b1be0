#include "client/dtctl/node_failure.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dt::ctl {

SlurmNode ParseSlurmNode(absl::string_view line) {
  SlurmNode node;
  line = absl::StripAsciiWhitespace(line);
  // Reason= comes last and holds spaces ("Not responding [slurm@2026-11-23T18:30:00]").
  if (size_t at = line.find(" Reason="); at != absl::string_view::npos) {
    node.reason = std::string(line.substr(at + 8));
    line = line.substr(0, at);
  }
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
    if (absl::ConsumePrefix(&field, "NodeName=")) {
      node.name = std::string(field);
    } else if (absl::ConsumePrefix(&field, "State=")) {
      node.state = std::string(field);
    } else if (absl::ConsumePrefix(&field, "SlurmdStartTime=")) {
      // Slurm prints local time without a zone.
      absl::Time t;
      std::string err;
      if (absl::ParseTime("%Y-%m-%dT%H:%M:%S", field, absl::LocalTimeZone(), &t, &err)) node.slurmd_started = t;
    }
  }
  return node;
}

namespace {
absl::Time FromTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}
}  // namespace

std::map<std::string, absl::Time> SuspectNodes(const v1::Run& run) {
  std::map<std::string, absl::Time> suspects;
  auto note = [&](const std::string& node, absl::Time heard) {
    if (node.empty() || absl::c_linear_search(run.excluded_nodes(), node)) return;
    auto [it, added] = suspects.emplace(node, heard);
    if (!added) it->second = std::max(it->second, heard);
  };
  for (const v1::RankStatus& rank : run.ranks()) {
    note(rank.node(), rank.has_last_heartbeat() ? FromTimestamp(rank.last_heartbeat()) : absl::InfinitePast());
  }
  for (const v1::Failure& f : run.failures()) {
    if (f.kind() == v1::Failure::HEARTBEAT_TIMEOUT) {
      note(f.node(), f.has_last_heard() ? FromTimestamp(f.last_heard()) : absl::InfinitePast());
    }
  }
  return suspects;
}

std::optional<std::string> NodeFailureEvidence(const SlurmNode& node, absl::Time last_heard) {
  for (const char* bad : {"DOWN", "FAIL", "DRAIN", "NOT_RESPONDING"}) {
    if (absl::StrContains(node.state, bad)) {
      return absl::StrCat("Slurm reports it ", node.state, node.reason.empty() ? "" : absl::StrCat(": ", node.reason));
    }
  }
  if (node.slurmd_started && last_heard != absl::InfinitePast() && *node.slurmd_started > last_heard) {
    return absl::StrCat("its slurmd started again at ",
                        absl::FormatTime("%Y-%m-%d %H:%M:%S", *node.slurmd_started, absl::LocalTimeZone()),
                        ", after the run last heard from its ranks");
  }
  return std::nullopt;
}

}  // namespace dt::ctl
