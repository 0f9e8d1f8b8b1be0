// srun's stderr, as Slurm 22.05 prints it, turned into the report that names the first failed task.
#include "client/dtctl/srun_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/utf8.h"

namespace dt::ctl {
namespace {

using ::testing::ElementsAre;

// What srun printed in the flaky test's run: task 1 SIGKILLed, then srun cancelled the step.
const char kKilledThenCancelled[] =
    "srun: error: n2: task 1: Killed\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=12.0\n"
    "slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-11-22T10:00:01 ***\n"
    "srun: error: n1: task 0: Killed\n";

TEST(SrunReport, ParsesEveryTaskEndInOrder) {
  auto ends = ParseSrunTaskEnds(kKilledThenCancelled);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0].nodes, "n2");
  EXPECT_THAT(ends[0].tasks, ElementsAre(1));
  EXPECT_EQ(ends[0].what, "Killed");
  EXPECT_EQ(ends[0].line, "srun: error: n2: task 1: Killed");
  EXPECT_THAT(ends[1].tasks, ElementsAre(0));
}

TEST(SrunReport, ParsesTaskRangesHostListsAndMessagesWithColons) {
  auto ends = ParseSrunTaskEnds(
      "srun: error: n[1-2]: tasks 0-2,5: Exited with exit code 3\r\n"
      "srun: error: gpu7: task 4: Segmentation fault (core dumped): see dmesg\n");
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0].nodes, "n[1-2]");
  EXPECT_THAT(ends[0].tasks, ElementsAre(0, 1, 2, 5));
  EXPECT_EQ(ends[0].what, "Exited with exit code 3");
  EXPECT_EQ(ends[1].what, "Segmentation fault (core dumped): see dmesg");
}

TEST(SrunReport, IgnoresLinesThatAreNotATasksEnd) {
  std::string text =
      "srun: error: Unable to create step for job 7: Requested node configuration is not available\n"
      "srun: error: n1: task x: Killed\n"
      "srun: error: n1: tasks 3-1: Killed\n"
      "srun: error: n1: task -1: Killed\n"
      "error: n1: task 1: Killed\n";
  EXPECT_TRUE(ParseSrunTaskEnds(text).empty());
  EXPECT_EQ(LastSrunError(text), "srun: error: n1: task -1: Killed");
  EXPECT_EQ(LastSrunError("srun: error: Unable to create step for job 7: busy\nsrun: done\n"),
            "srun: error: Unable to create step for job 7: busy");
  EXPECT_EQ(LastSrunError(kKilledThenCancelled), "");
}

TEST(SrunReport, TheFirstFailedTaskIsReportedByItsTaskId) {
  auto report = StepFailureReport("r-1", 3, 137, kKilledThenCancelled, "n1");
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->run_id(), "r-1");
  EXPECT_EQ(report->generation(), 3);
  EXPECT_EQ(report->rank(), -1);
  ASSERT_TRUE(report->has_scheduler_task());
  EXPECT_EQ(report->scheduler_task(), 1);
  EXPECT_EQ(report->node(), "n2");
  EXPECT_TRUE(report->process_exited());
  EXPECT_EQ(report->message(),
            "srun: task 1 on n2: Killed (the first task of the step to end badly; srun ended with code 137)");
}

TEST(SrunReport, AHostListIsNotPassedAsANode) {
  auto report = StepFailureReport("r-1", 0, 1, "srun: error: n[1-2]: tasks 2-3: Exited with exit code 1\n", "n1");
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->scheduler_task(), 2);
  EXPECT_EQ(report->node(), "");
}

TEST(SrunReport, SrunsOwnFailureIsReportedAgainstTheBatchNode) {
  auto report = StepFailureReport("r-1", 0, 1, "srun: error: Unable to create step for job 7: busy\n", "n1");
  ASSERT_TRUE(report.has_value());
  EXPECT_FALSE(report->has_scheduler_task());
  EXPECT_EQ(report->node(), "n1");
  EXPECT_EQ(report->local_slot(), -1);
  EXPECT_EQ(report->message(),
            "srun ended with code 1 before any task of the step failed: srun: error: Unable to create step for "
            "job 7: busy");
  EXPECT_FALSE(StepFailureReport("r-1", 0, 0, kKilledThenCancelled, "n1").has_value());
}

TEST(SrunReport, TheReportIsValidUtf8WhateverSrunPrinted) {
  std::string line = "srun: error: n1: task 0: Exited \xff\xfe with " + std::string(10000, 'x') + "\n";
  auto report = StepFailureReport("r-1", 0, 1, line, "n1");
  ASSERT_TRUE(report.has_value());
  EXPECT_TRUE(IsValidUtf8(report->message()));
  EXPECT_LE(report->message().size(), 4096u);
  EXPECT_NE(report->message().find("Exited \xEF\xBF\xBD\xEF\xBF\xBD with"), std::string::npos);
}

}  // namespace
}  // namespace dt::ctl
