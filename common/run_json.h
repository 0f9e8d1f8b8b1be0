// The JSON shapes of runs, failures, checkpoints and metric records: what `dtctl -o json` prints
// and what dtcoord's web console serves, so scripts and the page read one format.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "dt/v1/checkpoint.pb.h"
#include "dt/v1/common.pb.h"
#include "dt/v1/metrics.pb.h"
#include "dt/v1/runs.pb.h"

namespace dt {

// {"run_id","name","state","world_size","nodes","procs_per_node","procs_per_node_rule" (gpu|cpu|
//  auto, or ""),"procs_per_node_counted_on" (the node whose count fixed it),"generation","restarts",
//  "max_restarts","preemptions","max_requeues","excluded_nodes","min_nodes" (0: not elastic),
//  "generation_nodes","lost_nodes","generations":[{"generation","nodes","world_size","lost_nodes"}],
//  "step","total_steps","exp_dir",
//  "latest_checkpoint_step","resumed_from_step","reason","created_at","ended_at","scheduler",
//  "scheduler_job_id","trainer_args",
//  "ranks":[{"rank","local_rank","node","host","pid","state","step","generation","last_heartbeat",
//            "idle_seconds","scheduler_task"?,"preflight"?:{"device","matmul_size","matmul_seconds",
//            "allreduce_seconds","error"}}],
//  "failures": [FailureJson...]}
nlohmann::json RunJson(const v1::Run& run);
// {"kind","rank","host","node","generation","step","message","exception_type","stack",
//  "summary" (DescribeFailure's line),"stopped_ranks","fatal","before_first_step","time",
//  "verdict"?: VerdictJson}
nlohmann::json FailureJson(const v1::Failure& f);
// FailureJson without the verdict.
nlohmann::json FailureFields(const v1::Failure& f);
// A hang's verdict: {"summary","groups":[{"ranks","odd","frames":[{"function","file","line","module"}]}],
//  "odd_ranks","collectives","missing_ranks"}
nlohmann::json VerdictJson(const v1::HangVerdict& v);
// {"step","size","time","path","committed","generation"}
nlohmann::json CheckpointJson(const v1::CheckpointInfo& c);
// Who wrote a checkpoint: "rank 0", or "3 of 4 ranks (sharded)" (ranks that wrote files).
std::string CheckpointWriters(const v1::CheckpointInfo& c);
// {"step","rank","name","value","time"}
nlohmann::json MetricJson(const v1::MetricRecord& m);

// "2026-11-24T10:00:00.000Z"; "" when unset.
std::string Iso8601(const google::protobuf::Timestamp& t);

}  // namespace dt
