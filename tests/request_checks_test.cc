// The checks each RPC makes of its request's own fields: every bound refuses its first value past
// the limit with INVALID_ARGUMENT (RESOURCE_EXHAUSTED for a world too large) and a message naming
// the field and the limit, and takes the limit itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "coordinator/request_checks.h"

namespace dt {
namespace {

using ::testing::HasSubstr;

v1::RunSpec GoodSpec() {
  v1::RunSpec spec;
  spec.set_experiment_name("tiny");
  spec.set_save_dir("/tmp/dt-runs");
  spec.set_nodes(2);
  spec.set_procs_per_node(4);
  spec.set_max_restarts(3);
  spec.set_keep_checkpoints(2);
  spec.add_trainer_args("--steps");
  spec.add_trainer_args("10");
  return spec;
}

void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& names) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(names));
}

TEST(RunSpecCheckTest, TakesAnOrdinarySpec) { EXPECT_TRUE(ValidateRunSpec(GoodSpec()).ok()); }

TEST(RunSpecCheckTest, RefusesAShapeWithoutRanksOrBeyondTheWorldLimit) {
  v1::RunSpec spec = GoodSpec();
  spec.set_nodes(0);
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "nodes must be at least 1, not 0");
  spec = GoodSpec();
  spec.set_procs_per_node(0);
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "procs per node must be at least 1");
  spec = GoodSpec();
  spec.set_nodes(static_cast<int32_t>(kMaxWorldSize / 4 + 1));
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kResourceExhausted,
                absl::StrCat("exceeds the limit of ", kMaxWorldSize));
  spec.set_nodes(static_cast<int32_t>(kMaxWorldSize / 4));
  EXPECT_TRUE(ValidateRunSpec(spec).ok());
}

TEST(RunSpecCheckTest, PolicyCountsStopAtTheirLimit) {
  v1::RunSpec spec = GoodSpec();
  spec.set_max_requeues(kMaxPolicyCount);
  spec.set_max_restarts(kMaxPolicyCount);
  spec.set_keep_checkpoints(kMaxPolicyCount);
  spec.set_max_identical_hangs(kMaxPolicyCount);
  EXPECT_TRUE(ValidateRunSpec(spec).ok());
  std::string range = absl::StrCat("..", kMaxPolicyCount, ", not ", kMaxPolicyCount + 1);
  spec.set_max_requeues(kMaxPolicyCount + 1);
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "max requeues must be within 0" + range);
  spec = GoodSpec();
  spec.set_max_restarts(-1);
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "max restarts must be within 0..");
  spec = GoodSpec();
  spec.set_keep_checkpoints(kMaxPolicyCount + 1);
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "keep checkpoints must be within 0" + range);
  spec = GoodSpec();
  spec.set_max_identical_hangs(0);  // set but 0: a hang would end the run before it happened
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "max identical hangs must be within 1..");
}

TEST(RunSpecCheckTest, CommandWordsAreBoundedInCountAndLength) {
  v1::RunSpec spec = GoodSpec();
  spec.add_exec_command("");
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "the --exec command's program is empty");
  spec = GoodSpec();
  spec.add_sbatch_args(std::string(kMaxPathBytes + 1, 'x'));
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument,
                absl::StrCat("is longer than ", kMaxPathBytes, " bytes"));
  spec = GoodSpec();
  for (size_t i = 0; i <= kMaxTrainerArgs; ++i) spec.add_sbatch_args("--x");
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument,
                absl::StrCat(kMaxTrainerArgs + 1, " sbatch arguments exceed the limit of ", kMaxTrainerArgs));
  spec = GoodSpec();
  spec.add_exec_command("python3");
  spec.add_exec_command(std::string(kMaxPathBytes, 'a'));  // at the limit
  EXPECT_TRUE(ValidateRunSpec(spec).ok());
}

TEST(RunSpecCheckTest, RefusesAChosenWandbServerAndUnknownModes) {
  v1::RunSpec spec = GoodSpec();
  spec.mutable_wandb()->set_base_url("http://elsewhere.example");
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "leave wandb.base_url empty");
  spec = GoodSpec();
  spec.mutable_wandb()->set_mode("sometimes");
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument, "is not one of online, offline, disabled");
  spec = GoodSpec();
  (*spec.mutable_labels())["team"] = std::string(kMaxLabelValueBytes + 1, 'v');
  ExpectRefused(ValidateRunSpec(spec), absl::StatusCode::kInvalidArgument,
                absl::StrCat("a label's value has at most ", kMaxLabelValueBytes));
}

TEST(ReportCheckTest, StopsTakeARealSignalAndLeavesMayHaveNone) {
  v1::ReportStoppedRequest stopped;
  stopped.set_signal(15);
  EXPECT_TRUE(ValidateReportStoppedRequest(stopped).ok());
  stopped.set_signal(0);
  ExpectRefused(ValidateReportStoppedRequest(stopped), absl::StatusCode::kInvalidArgument,
                absl::StrCat("signal must be within 1..", kMaxSignal, ", not 0"));
  stopped.set_signal(kMaxSignal + 1);
  ExpectRefused(ValidateReportStoppedRequest(stopped), absl::StatusCode::kInvalidArgument, "signal must be within");
  stopped.set_signal(kMaxSignal);
  stopped.set_step(-1);
  ExpectRefused(ValidateReportStoppedRequest(stopped), absl::StatusCode::kInvalidArgument, "step must not be negative");

  v1::LeaveRequest leave;
  EXPECT_TRUE(ValidateLeaveRequest(leave).ok());  // a clean exit: no signal
  leave.set_signal(-1);
  ExpectRefused(ValidateLeaveRequest(leave), absl::StatusCode::kInvalidArgument,
                absl::StrCat("signal must be within 0..", kMaxSignal, ", not -1"));
  leave.set_signal(0);
  leave.set_final_step(-3);
  ExpectRefused(ValidateLeaveRequest(leave), absl::StatusCode::kInvalidArgument, "final step must not be negative");
}

TEST(StacksCheckTest, CapturesAreNamedAndQueriesBounded) {
  v1::ReportStacksRequest report;
  ExpectRefused(ValidateReportStacksRequest(report), absl::StatusCode::kInvalidArgument,
                absl::StrCat("capture id must be 1..", kMaxNameChars, " characters"));
  report.set_capture_id(std::string(kMaxNameChars, 'c'));
  EXPECT_TRUE(ValidateReportStacksRequest(report).ok());
  report.set_capture_id(std::string(kMaxNameChars + 1, 'c'));
  EXPECT_EQ(ValidateReportStacksRequest(report).code(), absl::StatusCode::kInvalidArgument);

  v1::GetStacksRequest query;
  query.set_limit(kMaxStackCapturesPerQuery);
  EXPECT_TRUE(ValidateGetStacksRequest(query).ok());
  query.set_limit(kMaxStackCapturesPerQuery + 1);
  ExpectRefused(ValidateGetStacksRequest(query), absl::StatusCode::kInvalidArgument,
                absl::StrCat("limit must be within 0..", kMaxStackCapturesPerQuery));
  query.set_limit(0);
  query.set_generation(-1);
  ExpectRefused(ValidateGetStacksRequest(query), absl::StatusCode::kInvalidArgument, "generation must not be negative");
}

TEST(MetricsCheckTest, QueriesAreBoundedAndNamesWellFormed) {
  v1::QueryMetricsRequest query;
  query.set_limit(kMaxMetricRecordsPerQuery);
  query.set_name("loss");
  EXPECT_TRUE(ValidateQueryMetricsRequest(query).ok());
  query.set_limit(kMaxMetricRecordsPerQuery + 1);
  ExpectRefused(ValidateQueryMetricsRequest(query), absl::StatusCode::kInvalidArgument,
                "page through longer histories with `after`");
  query.set_limit(0);
  query.set_name("bad name\n");
  EXPECT_EQ(ValidateQueryMetricsRequest(query).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dt
