// When a failure is one a restart cannot mend: a hang with the odd stack of the generations just
// before it, or the same exception from the same rank before its first step, twice in a row.
#include "coordinator/repeated_failures.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dt {
namespace {

using ::testing::HasSubstr;

v1::Failure Hang(int64_t generation, const std::string& odd_signature) {
  v1::Failure f;
  f.set_kind(v1::Failure::HANG);
  f.set_generation(generation);
  f.set_message("no step for 30s");
  f.mutable_verdict()->set_odd_signature(odd_signature);
  return f;
}

v1::Failure EarlyError(int64_t generation, int rank, const std::string& type, const std::string& message) {
  v1::Failure f;
  f.set_kind(v1::Failure::REPORTED_ERROR);
  f.set_generation(generation);
  f.set_rank(rank);
  f.set_exception_type(type);
  f.set_message(message);
  f.set_before_first_step(true);
  return f;
}

TEST(RepeatedHang, TheSameOddStackAsTheGenerationBeforeEndsTheRun) {
  v1::Failure now = Hang(2, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a")}, 1, now);
  EXPECT_EQ(now.kind(), v1::Failure::HUNG_REPEATEDLY);
  EXPECT_TRUE(now.fatal());
  EXPECT_THAT(now.message(), HasSubstr("generation 2 hung the way generation 1 did"));
  EXPECT_THAT(now.message(), HasSubstr("--max-identical-hangs 1"));
  EXPECT_THAT(now.message(), HasSubstr("no step for 30s"));  // the hang's own message is kept
}

TEST(RepeatedHang, AnotherOddStackOrNoneIsAnotherHang) {
  v1::Failure other = Hang(2, "sig-b");
  MarkRepeatedHang({Hang(1, "sig-a")}, 1, other);
  EXPECT_EQ(other.kind(), v1::Failure::HANG);
  EXPECT_FALSE(other.fatal());

  v1::Failure unjudged = Hang(2, "");  // no odd stack: nothing to compare
  MarkRepeatedHang({Hang(1, "")}, 1, unjudged);
  EXPECT_EQ(unjudged.kind(), v1::Failure::HANG);
}

TEST(RepeatedHang, OnlyAnUnbrokenRunOfGenerationsCounts) {
  // Generation 2 ended by a crash between two identical hangs: generation 3's hang follows no hang
  // (the crash carries the same signature, so only its kind tells it apart).
  v1::Failure crash = Hang(2, "sig-a");
  crash.set_kind(v1::Failure::PROCESS_EXITED);
  v1::Failure now = Hang(3, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a"), crash}, 1, now);
  EXPECT_EQ(now.kind(), v1::Failure::HANG);

  // A missing generation (it never failed) breaks the run too.
  v1::Failure gap = Hang(3, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a")}, 1, gap);
  EXPECT_EQ(gap.kind(), v1::Failure::HANG);
}

TEST(RepeatedHang, EachGenerationIsJudgedByItsNewestFailure) {
  v1::Failure node_lost;
  node_lost.set_kind(v1::Failure::NODE_FAILED);
  node_lost.set_generation(1);

  // Generation 1 hung, and a node failure was recorded for it afterwards: it ended otherwise.
  v1::Failure after_node = Hang(2, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a"), node_lost}, 1, after_node);
  EXPECT_EQ(after_node.kind(), v1::Failure::HANG);

  // The node failure came first and the hang last: generation 1 ended by the hang.
  v1::Failure after_hang = Hang(2, "sig-a");
  MarkRepeatedHang({node_lost, Hang(1, "sig-a")}, 1, after_hang);
  EXPECT_EQ(after_hang.kind(), v1::Failure::HUNG_REPEATEDLY);

  // Failures already recorded for this generation (or a later one) are not the ones before it.
  v1::Failure with_own = Hang(2, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a"), node_lost, Hang(2, "sig-b")}, 1, with_own);
  EXPECT_EQ(with_own.kind(), v1::Failure::HANG);  // node_lost is generation 1's newest
  v1::Failure skipped = Hang(2, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a"), Hang(2, "sig-b"), Hang(3, "sig-c")}, 1, skipped);
  EXPECT_EQ(skipped.kind(), v1::Failure::HUNG_REPEATEDLY);
}

TEST(RepeatedHang, AllowedCountsTheIdenticalHangsBeforeTheRunEnds) {
  v1::Failure second = Hang(2, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a")}, 2, second);
  EXPECT_EQ(second.kind(), v1::Failure::HANG);  // one earlier hang, two allowed

  v1::Failure third = Hang(3, "sig-a");
  MarkRepeatedHang({Hang(1, "sig-a"), Hang(2, "sig-a")}, 2, third);
  EXPECT_EQ(third.kind(), v1::Failure::HUNG_REPEATEDLY);
  EXPECT_THAT(third.message(), HasSubstr("the way generations 1, 2 did"));
}

TEST(RepeatedEarlyFailure, TheSameErrorBeforeTheFirstStepTwiceEndsTheRun) {
  v1::Failure now = EarlyError(4, 1, "OSError", "cannot open /data/shard-0017 (pid 4242)");
  MarkRepeatedEarlyFailure({EarlyError(3, 1, "OSError", "cannot open /data/shard-0017 (pid 3131)")}, now);
  EXPECT_TRUE(now.fatal());  // the pid differs, the failure is the same
  EXPECT_THAT(now.message(), HasSubstr("the same OSError ended generation 3 before its first step too (from rank 1)"));
}

TEST(RepeatedEarlyFailure, TheSameErrorFromAnotherRankIsRepeatedToo) {
  // Every rank lacks the module; rank 1 was reported first in generation 3, rank 0 in 4.
  v1::Failure now = EarlyError(4, 0, "ModuleNotFoundError", "No module named 'x' (output in logs/rank-0.log)");
  MarkRepeatedEarlyFailure({EarlyError(3, 1, "ModuleNotFoundError", "No module named 'x' (output in logs/rank-1.log)")},
                           now);
  EXPECT_TRUE(now.fatal());
  EXPECT_THAT(now.message(), HasSubstr("ended generation 3 before its first step too (from rank 1)"));
}

// Numbers of other lengths are other numbers too: seen in the suite when pids passed 999.
TEST(RepeatedEarlyFailure, ANumberOfAnotherLengthIsTheSameFailure) {
  v1::Failure now = EarlyError(1, 1, "ModuleNotFoundError", "No module named 'x' (pid 1010 exited with code 1)");
  MarkRepeatedEarlyFailure(
      {EarlyError(0, 0, "ModuleNotFoundError", "No module named 'x' (pid 981 exited with code 1)")}, now);
  EXPECT_TRUE(now.fatal()) << now.message();
}

TEST(RepeatedEarlyFailure, AnotherTypeMessageOrGenerationIsNotRepeated) {
  const v1::Failure before = EarlyError(3, 1, "OSError", "cannot open /data/a");
  for (v1::Failure now :
       {EarlyError(4, 1, "ValueError", "cannot open /data/a"), EarlyError(4, 1, "OSError", "cannot open /data/b"),
        EarlyError(5, 1, "OSError", "cannot open /data/a")}) {
    MarkRepeatedEarlyFailure({before}, now);
    EXPECT_FALSE(now.fatal()) << now.ShortDebugString();
  }
}

TEST(RepeatedEarlyFailure, OnlyAnErrorOrAnExitBeforeCountsAsTheSameFailure) {
  v1::Failure exited = EarlyError(3, 1, "OSError", "cannot open /data/a");
  exited.set_kind(v1::Failure::PROCESS_EXITED);
  v1::Failure after_exit = EarlyError(4, 1, "OSError", "cannot open /data/a");
  MarkRepeatedEarlyFailure({exited}, after_exit);
  EXPECT_TRUE(after_exit.fatal());

  // Generation 3 was ended by something else that happened to carry the same fields.
  v1::Failure hung = EarlyError(3, 1, "OSError", "cannot open /data/a");
  hung.set_kind(v1::Failure::HANG);
  v1::Failure after_hang = EarlyError(4, 1, "OSError", "cannot open /data/a");
  MarkRepeatedEarlyFailure({hung}, after_hang);
  EXPECT_FALSE(after_hang.fatal());
}

TEST(RepeatedEarlyFailure, AFailureAfterTrainingBeganIsNeverRepeated) {
  v1::Failure later = EarlyError(4, 1, "OSError", "cannot open /data/a");
  later.set_before_first_step(false);
  MarkRepeatedEarlyFailure({EarlyError(3, 1, "OSError", "cannot open /data/a")}, later);
  EXPECT_FALSE(later.fatal());

  v1::Failure now = EarlyError(4, 1, "OSError", "cannot open /data/a");
  v1::Failure trained = EarlyError(3, 1, "OSError", "cannot open /data/a");
  trained.set_before_first_step(false);  // the generation before had trained
  MarkRepeatedEarlyFailure({trained}, now);
  EXPECT_FALSE(now.fatal());
}

}  // namespace
}  // namespace dt
