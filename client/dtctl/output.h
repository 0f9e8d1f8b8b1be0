// How dtctl shows things: the JSON shapes scripts rely on, human tables, durations and sizes.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dt/v1/common.pb.h"
#include "dt/v1/metrics.pb.h"
#include "dt/v1/runs.pb.h"

namespace dt::ctl {

std::string StateName(v1::RunState state);
// {"run_id","name","state","world_size","generation","restarts","step","total_steps","exp_dir",
//  "latest_checkpoint_step","reason","created_at","ended_at","scheduler","scheduler_job_id",
//  "ranks":[{"rank","local_rank","node","host","pid","state","step",
//            "preflight":{"device","matmul_size","matmul_seconds","allreduce_seconds","error"}}],
//  "failures": [...]}
nlohmann::json RunJson(const v1::Run& run);
nlohmann::json FailureJson(const v1::Failure& f);
nlohmann::json CheckpointJson(const v1::CheckpointInfo& c);
nlohmann::json MetricJson(const v1::MetricRecord& m);

// A left-aligned table with a header row.
std::string Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

std::string Iso8601(const google::protobuf::Timestamp& t);  // "" when unset
std::string Ago(const google::protobuf::Timestamp& t);      // "3m ago"
std::string HumanBytes(int64_t bytes);                      // "1.5 GiB"
std::string HumanSeconds(double seconds);                   // "1h02m", "45s"
std::string FailureLine(const v1::Failure& f);              // DescribeFailure, escaped for a terminal
std::string PreflightCell(const v1::RankStatus& rank);      // "9.1 ms", "device error" or ""

}  // namespace dt::ctl
