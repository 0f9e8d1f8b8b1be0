// `dtctl stacks RUN`: the stacks of a run's processes. While the run trains, a live capture (the
// run goes on); for an ended run, or with --generation or --stored, the captures the coordinator
// kept (every hang's, and the latest on-demand ones).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace dt::ctl {

struct StacksQuery {
  std::string run_id;
  std::optional<int> rank;            // only this rank's stacks
  std::optional<int64_t> generation;  // a stored capture of this generation
  bool stored = false;                // stored captures even while the run trains
};

// The captures to show, newest first: one live capture, or the stored ones (possibly none).
absl::StatusOr<std::vector<v1::StackCapture>> FetchStacks(CoordinatorClient& client, const StacksQuery& query);

// For people: each capture's verdict, its groups, then every rank's processes and threads (only
// `rank`'s when given). Escaped for the terminal.
std::string FormatCaptures(const std::vector<v1::StackCapture>& captures, std::optional<int> rank);

// For scripts: the captures as protobuf's JSON (field names as in proto/dt/v1/stacks.proto).
nlohmann::json CapturesJson(const std::vector<v1::StackCapture>& captures, std::optional<int> rank);

}  // namespace dt::ctl
