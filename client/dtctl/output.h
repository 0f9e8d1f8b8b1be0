// How dtctl shows things: human tables, durations and sizes (the JSON shapes scripts rely on are
// common/run_json.h, shared with the web console).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/run_json.h"
#include "common/run_state.h"

namespace dt::ctl {

// A left-aligned table with a header row.
std::string Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

std::string Ago(const google::protobuf::Timestamp& t);  // "3m ago"
std::string HumanBytes(int64_t bytes);                  // "1.5 GiB"
std::string HumanSeconds(double seconds);               // "1h02m", "45s"
std::string FailureLine(const v1::Failure& f);          // DescribeFailure, escaped for a terminal
// A hang's verdict under `dtctl status`: the summary, then one stack per group (8 frames).
std::string VerdictLines(const v1::HangVerdict& verdict);

std::string PreflightCell(const v1::RankStatus& rank);  // "9.1 ms", "device error" or ""

}  // namespace dt::ctl
