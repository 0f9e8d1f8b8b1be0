// dttrainer end to end, on CPU with real processes: the dtcoord binary, trainers joined through
// its store into real Gloo process groups. DDP equivalence, exact resume after a crash, learning,
// and a rank killed mid-run.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;
using testing::Subprocess;

constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(200);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(2);

class TrainerE2ETest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  CoordinatorProcess coord_{tmp_.path(),
                            {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--hang-timeout", "2m",
                             "--rendezvous-timeout", "1m"}};

  v1::SubmitRunResponse Submit(const std::string& name, int procs, int max_restarts = 0) {
    return coord_.Submit(testing::MakeSpec(name, save_dir_, 1, procs, max_restarts));
  }

  // Starts `procs` trainers of the run on one node; their output goes to <tmp>/<run>-rank<i>.log.
  std::vector<std::unique_ptr<Subprocess>> Start(const v1::SubmitRunResponse& run, int procs,
                                                 std::vector<std::string> args) {
    return testing::StartTrainers(coord_, run, 1, procs, args, tmp_.path());
  }

  std::string Log(const v1::SubmitRunResponse& run, int rank) { return testing::TrainerLog(tmp_.path(), run, rank); }

  // A 2-rank run of `extra` more flags that vanishes after its checkpoint at step 10 and is
  // resumed ends bit for bit where a run that never stopped ends (testing::ExpectResumeAfterACrashIsExact).
  // `runs`, when given, gets the straight, crashed and resumed runs.
  void ExpectResumeAfterACrashIsExact(const std::string& name, const std::vector<std::string>& extra,
                                      std::vector<v1::SubmitRunResponse>* runs = nullptr) {
    std::vector<std::string> args = {"--max-steps",  "20", "--ckpt-freq", "10",   "--batch-size",   "2",
                                     "--seed",       "5",  "--lr",        "1e-3", "--warmup-steps", "3",
                                     "--eval-split", "0",  "--dropout",   "0.1"};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::ExpectResumeAfterACrashIsExact(
        coord_, save_dir_, tmp_.path(), name, args, 10, 20,
        [&](const std::string& experiment, const std::vector<std::string>& a, int code) {
          auto run = Submit(experiment, 2);
          if (runs != nullptr) runs->push_back(run);
          auto procs = Start(run, 2, a);
          ExpectExit(run, procs, code);
          return run;
        });
  }

  // Waits for every trainer and expects exit code `code`.
  void ExpectExit(const v1::SubmitRunResponse& run, std::vector<std::unique_ptr<Subprocess>>& procs, int code,
                  absl::Duration timeout = absl::Minutes(3)) {
    for (size_t i = 0; i < procs.size(); ++i) {
      int status = procs[i]->Wait(timeout);
      ASSERT_NE(status, -1) << "trainer " << i << " did not finish:\n" << testing::Slurp(Log(run, i));
      ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status) << "\n" << testing::Slurp(Log(run, i));
      EXPECT_EQ(WEXITSTATUS(status), code) << testing::Slurp(Log(run, i));
    }
  }
};

TEST_F(TrainerE2ETest, TwoRanksOfBatchBEqualOneRankOfBatch2B) {
  std::vector<std::string> common = {"--max-steps", "4",    "--eval-split", "0",         "--seed",
                                     "3",           "--lr", "1e-3",         "--dropout", "0"};
  auto one = Submit("ddp-one", 1);
  auto p1 = Start(one, 1, [&] {
    auto a = common;
    a.insert(a.end(), {"--batch-size", "4"});
    return a;
  }());
  ASSERT_NO_FATAL_FAILURE(ExpectExit(one, p1, 0));
  auto two = Submit("ddp-two", 2);
  auto p2 = Start(two, 2, [&] {
    auto a = common;
    a.insert(a.end(), {"--batch-size", "2"});
    return a;
  }());
  ASSERT_NO_FATAL_FAILURE(ExpectExit(two, p2, 0));
  // Accumulation: 2 ranks x batch 1 x 2 micro-steps is the same global batch again.
  auto acc = Submit("ddp-accum", 2);
  auto p3 = Start(acc, 2, [&] {
    auto a = common;
    a.insert(a.end(), {"--batch-size", "1", "--grad-accum", "2"});
    return a;
  }());
  ASSERT_NO_FATAL_FAILURE(ExpectExit(acc, p3, 0));

  EXPECT_LE(testing::CheckpointMaxAbsDiff(save_dir_, "ddp-one", "ddp-two", 4), 1e-5);
  EXPECT_LE(testing::CheckpointMaxAbsDiff(save_dir_, "ddp-one", "ddp-accum", 4), 1e-5);
  // The runs did train: the parameters moved away from the start (a 0-step run of the same seed
  // would differ by more than the tolerance).
  auto losses = coord_.Metrics(two.run_id(), "loss", 0);
  ASSERT_EQ(losses.size(), 4u);
  auto single = coord_.Metrics(one.run_id(), "loss", 0);
  ASSERT_EQ(single.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(losses[i].value(), single[i].value(), 1e-4) << "step " << i + 1;
  EXPECT_EQ(coord_.GetRun(two.run_id()).state(), v1::SUCCEEDED);
}

// OpenBLAS picks its kernels from the CPU's model when LibTorch loads it; on a model newer than
// the library (this project's Emerald Rapids VMs with Debian 12's OpenBLAS) it falls back to
// Prescott's, 2x slower for a step. A trainer started by hand (as srun starts them) runs the best
// kernels of its CPU all the same, and trains.
TEST_F(TrainerE2ETest, ATrainerStartedByHandRunsTheBestOpenBlasKernelsOfItsCpu) {
  auto run = Submit("blas", 1);
  auto procs = Start(run, 1, {"--max-steps", "1", "--eval-split", "0"});
  ASSERT_NO_FATAL_FAILURE(ExpectExit(run, procs, 0));
  std::string log = testing::Slurp(Log(run, 0));
  EXPECT_NE(log.find(testing::ExpectedOpenBlasKernels()), std::string::npos) << log;
  EXPECT_NE(log.find("step 1/1"), std::string::npos) << log;
}

TEST_F(TrainerE2ETest, ResumeAfterACrashIsExact) {
  ASSERT_NO_FATAL_FAILURE(ExpectResumeAfterACrashIsExact("fp32", {}));
}

// A GPU rank makes a step's line and metrics point while the next step runs (the step's loss is
// read from the device a step late) and begins a round before its step's point is made; the round's
// commit waits for it. --late-step-points does the same on the CPU: a run that vanishes after its
// round at step 10 has every point to 10 in its history, once, and its resume is still exact; a
// synchronous round does not wait for its own point.
TEST_F(TrainerE2ETest, PointsMadeAStepLateKeepTheHistoryWholeAndTheResumeExact) {
  std::vector<v1::SubmitRunResponse> runs;
  ASSERT_NO_FATAL_FAILURE(ExpectResumeAfterACrashIsExact("late", {"--late-step-points", "--log-freq", "1"}, &runs));
  ASSERT_EQ(runs.size(), 3u);
  for (const auto& [run, steps] : {std::pair{runs[0], 20}, std::pair{runs[1], 10}}) {
    auto losses = coord_.Metrics(run.run_id(), "loss", 0);
    ASSERT_EQ(losses.size(), static_cast<size_t>(steps)) << run.run_id();
    for (int i = 0; i < steps; ++i) EXPECT_EQ(losses[i].step(), i + 1) << run.run_id();
  }
  // Each line is made once, in order, the last one too.
  std::string log = testing::Slurp(Log(runs[0], 0));
  size_t at = 0;
  for (int step = 1; step <= 20; ++step) {
    std::string line = absl::StrCat("step ", step, "/20 loss ");
    size_t found = log.find(line, at);
    ASSERT_NE(found, std::string::npos) << line << " after offset " << at << ":\n" << log;
    EXPECT_EQ(log.find(line, found + 1), std::string::npos) << line << " twice";
    at = found;
  }
  // A synchronous round commits on the loop's own thread: it makes the held point itself (waiting
  // for it there would never end).
  auto sync = Submit("late-sync", 1);
  auto procs = Start(sync, 1,
                     {"--late-step-points", "--sync-checkpoint", "--ckpt-freq", "2", "--max-steps", "4", "--log-freq",
                      "1", "--batch-size", "2", "--eval-split", "0"});
  ASSERT_NO_FATAL_FAILURE(ExpectExit(sync, procs, 0, absl::Minutes(1)));
  auto losses = coord_.Metrics(sync.run_id(), "loss", 0);
  ASSERT_EQ(losses.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(losses[i].step(), i + 1);
}

// bf16 autocast keeps fp32 master weights and AdamW state, which a checkpoint holds whole: a bf16
// run resumes bit for bit as well.
// Its checkpoints written behind, as a GPU's are (--checkpoint-io auto): the resume reads them back whole.
TEST_F(TrainerE2ETest, Bf16ResumeAfterACrashIsExact) {
  ASSERT_NO_FATAL_FAILURE(
      ExpectResumeAfterACrashIsExact("bf16", {"--precision", "bf16", "--checkpoint-io", "write-behind"}));
}

// bf16 trains what fp32 trains: on the same data and seed, every logged loss of 200 steps stays
// within 2% of fp32's (measured here: at most 0.77%).
TEST_F(TrainerE2ETest, Bf16LossesStayWithinTwoPercentOfFp32) {
  std::vector<std::string> args = {"--max-steps",    "200", "--batch-size", "8", "--lr",       "2e-3",
                                   "--warmup-steps", "20",  "--eval-split", "0", "--log-freq", "10",
                                   "--threads",      "2"};
  std::map<std::string, std::string> runs;
  for (const char* precision : {"fp32", "bf16"}) {
    auto run = Submit(absl::StrCat("learn-", precision), 1);
    auto run_args = args;
    run_args.insert(run_args.end(), {"--precision", precision});
    auto p = Start(run, 1, run_args);
    ASSERT_NO_FATAL_FAILURE(ExpectExit(run, p, 0, absl::Minutes(5)));
    EXPECT_NE(testing::Slurp(Log(run, 0)).find(absl::StrCat(precision, " on cpu")), std::string::npos);
    runs[precision] = run.run_id();
  }
  double worst = testing::ExpectLossesClose(coord_, runs["fp32"], runs["bf16"], 0.02, 20);
  auto bf16 = coord_.Metrics(runs["bf16"], "loss", 0);
  ASSERT_EQ(bf16.size(), 20u);
  EXPECT_LT(bf16.back().value(), bf16.front().value() - 2.0);  // it learned
  // Not the same numbers: autocast did run the products in bf16.
  EXPECT_GT(worst, 1e-4);
  std::cout << "bf16 against fp32: largest relative loss difference " << worst << "\n";
}

// Asynchronous rounds (the default): the writer copies the state at the step boundary and writes
// it in the background. A writer that dies after writing its files but before the commit leaves
// `latest` on the previous checkpoint (the coordinator removes the half-done round); the next run
// resumes there and ends with the parameters of a run that never crashed.
TEST_F(TrainerE2ETest, AWriterThatDiesBeforeItsCommitLeavesLatestOnThePreviousCheckpoint) {
  std::vector<std::string> args = {"--max-steps",  "20", "--ckpt-freq", "5",    "--batch-size",   "2",
                                   "--seed",       "7",  "--lr",        "1e-3", "--warmup-steps", "3",
                                   "--eval-split", "0",  "--dropout",   "0.1"};
  auto straight = Submit("async-straight", 2);
  auto ps = Start(straight, 2, args);
  ASSERT_NO_FATAL_FAILURE(ExpectExit(straight, ps, 0));

  auto crashed = Submit("async-crash", 2);
  auto crash_args = args;
  crash_args.insert(crash_args.end(), {"--exit-while-checkpointing", "10"});
  auto pc = Start(crashed, 2, crash_args);
  int writer = pc[0]->Wait(absl::Minutes(2));
  ASSERT_TRUE(WIFEXITED(writer) && WEXITSTATUS(writer) == 137) << testing::Slurp(Log(crashed, 0));
  ASSERT_TRUE(
      testing::WaitFor([&] { return coord_.GetRun(crashed.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
  pc[1]->Wait(absl::Minutes(1));
  std::string ckpts = JoinPath(save_dir_, "async-crash/checkpoints");
  char target[64] = {};
  ASSERT_GT(::readlink(JoinPath(ckpts, "latest").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "step-5");
  EXPECT_FALSE(std::filesystem::exists(JoinPath(ckpts, "step-10")));
  // The coordinator aborted the round with the generation and removed what the writer wrote.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        for (const auto& e : std::filesystem::directory_iterator(ckpts)) {
          if (e.path().filename().string().find(".partial-") != std::string::npos) return false;
        }
        return true;
      },
      absl::Seconds(10)));

  auto resumed = Submit("async-crash", 2);
  EXPECT_EQ(resumed.resume_step(), 5);
  auto pr = Start(resumed, 2, args);
  ASSERT_NO_FATAL_FAILURE(ExpectExit(resumed, pr, 0));
  auto got = coord_.Metrics(resumed.run_id(), "loss", 0);
  ASSERT_EQ(got.size(), 15u);  // steps 6..20
  EXPECT_EQ(got[0].step(), 6);
  EXPECT_EQ(testing::CheckpointMaxAbsDiff(save_dir_, "async-straight", "async-crash", 20), 0.0);
  // The pause of an asynchronous round is reported beside its duration.
  EXPECT_FALSE(coord_.Metrics(resumed.run_id(), "checkpoint_pause_seconds", 0).empty());
  EXPECT_FALSE(coord_.Metrics(resumed.run_id(), "checkpoint_seconds", 0).empty());
}

TEST_F(TrainerE2ETest, ResumingWithAnotherShapeContinuesAtTheSameSample) {
  // A learning rate too small to move the model makes every step's loss a function of its data
  // alone, so the loss tells which samples a step saw.
  std::vector<std::string> args = {"--max-steps", "20",    "--ckpt-freq",  "10", "--seed",    "9",
                                   "--lr",        "1e-12", "--eval-split", "0",  "--dropout", "0"};
  auto with_batch = [&](std::vector<std::string> a, const char* batch) {
    a.insert(a.end(), {"--batch-size", batch});
    return a;
  };
  auto straight = Submit("shape-straight", 2);
  auto ps = Start(straight, 2, with_batch(args, "2"));
  ASSERT_NO_FATAL_FAILURE(ExpectExit(straight, ps, 0));

  auto crashed = Submit("shape", 2);
  auto crash_args = with_batch(args, "2");
  crash_args.insert(crash_args.end(), {"--exit-after-step", "10"});
  auto pc = Start(crashed, 2, crash_args);
  ASSERT_NO_FATAL_FAILURE(ExpectExit(crashed, pc, 137));
  ASSERT_TRUE(
      testing::WaitFor([&] { return coord_.GetRun(crashed.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
  // 2 ranks x batch 2 stopped after 40 samples; 1 rank x batch 8 continues at sample 40, so each
  // of its steps sees the samples of two steps of the straight run.
  auto resumed = Submit("shape", 1);
  ASSERT_EQ(resumed.resume_step(), 10);
  auto pr = Start(resumed, 1, with_batch(args, "8"));
  ASSERT_NO_FATAL_FAILURE(ExpectExit(resumed, pr, 0));
  EXPECT_NE(testing::Slurp(Log(resumed, 0)).find("continuing at sample 40"), std::string::npos)
      << testing::Slurp(Log(resumed, 0));

  auto want = coord_.Metrics(straight.run_id(), "loss", 0);
  auto got = coord_.Metrics(resumed.run_id(), "loss", 0);
  ASSERT_EQ(want.size(), 20u);
  ASSERT_GE(got.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(got[i].step(), 11 + i);
    double pair = (want[10 + 2 * i].value() + want[11 + 2 * i].value()) / 2;
    EXPECT_NEAR(got[i].value(), pair, 1e-4) << "step " << 11 + i;
  }
}

// --global-batch-size keeps the samples of every optimizer step whatever the world size: a 4-rank
// run resumed on 2 ranks (and a 2-rank run resumed on 4) trains on as the uninterrupted run does,
// the accumulation recomputed; a global batch the ranks cannot make is refused with the arithmetic.
TEST_F(TrainerE2ETest, AResumeAtAnotherWorldSizeKeepsTheGlobalBatchAndTheLosses) {
  const std::vector<std::string> args = {"--max-steps",  "12",   "--ckpt-freq",         "6", "--seed",    "3",
                                         "--lr",         "1e-3", "--eval-split",        "0", "--dropout", "0",
                                         "--batch-size", "1",    "--global-batch-size", "4"};
  auto run_to_end = [&](const std::string& name, int ranks) {
    auto run = Submit(name, ranks);
    auto p = Start(run, ranks, args);
    EXPECT_NO_FATAL_FAILURE(ExpectExit(run, p, 0));
    return run;
  };
  // Crashes after step 6 (checkpointed) at `from` ranks, resumes at `to` ranks.
  auto crash_and_resume = [&](const std::string& name, int from, int to) {
    auto crashed = Submit(name, from);
    auto crash_args = args;
    crash_args.insert(crash_args.end(), {"--exit-after-step", "6"});
    auto pc = Start(crashed, from, crash_args);
    EXPECT_NO_FATAL_FAILURE(ExpectExit(crashed, pc, 137));
    EXPECT_TRUE(
        testing::WaitFor([&] { return coord_.GetRun(crashed.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
    auto resumed = Submit(name, to);
    EXPECT_EQ(resumed.resume_step(), 6);
    auto pr = Start(resumed, to, args);
    EXPECT_NO_FATAL_FAILURE(ExpectExit(resumed, pr, 0));
    std::string log = testing::Slurp(Log(resumed, 0));
    EXPECT_NE(log.find(absl::StrCat("with the global batch of 4 kept (", to, " ranks x batch 1 x accumulation ", 4 / to,
                                    ")")),
              std::string::npos)
        << log;
    return resumed;
  };
  auto expect_same_losses = [&](const v1::SubmitRunResponse& want_run, const v1::SubmitRunResponse& got_run,
                                int first_step) {
    auto want = coord_.Metrics(want_run.run_id(), "loss", 0);
    auto got = coord_.Metrics(got_run.run_id(), "loss", 0);
    ASSERT_EQ(want.size(), 12u);
    ASSERT_EQ(got.size(), static_cast<size_t>(13 - first_step));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].step(), first_step + static_cast<int64_t>(i));
      EXPECT_NEAR(got[i].value(), want[first_step - 1 + i].value(), 1e-4) << "step " << got[i].step();
    }
  };
  auto four = run_to_end("global-4", 4);
  auto two = run_to_end("global-2", 2);
  expect_same_losses(four, two, 1);  // 4 x 1 x 1 and 2 x 1 x 2: the same steps
  auto four_to_two = crash_and_resume("global-4-to-2", 4, 2);
  expect_same_losses(four, four_to_two, 7);
  auto two_to_four = crash_and_resume("global-2-to-4", 2, 4);
  expect_same_losses(two, two_to_four, 7);

  // 3 is no multiple of 2 ranks x batch 1: refused, saying why, before any step. The run fails with
  // the first rank's report; the other rank reports the same (exit 2) or, when the run's end
  // reaches it first, is stopped (exit 3).
  auto odd = Submit("global-odd", 2);
  auto odd_args = args;
  odd_args.back() = "3";
  auto po = Start(odd, 2, odd_args);
  int refused = 0;
  for (size_t i = 0; i < po.size(); ++i) {
    int status = po[i]->Wait(absl::Minutes(3));
    ASSERT_TRUE(status != -1 && WIFEXITED(status)) << testing::Slurp(Log(odd, i));
    EXPECT_TRUE(WEXITSTATUS(status) == 2 || WEXITSTATUS(status) == 3) << testing::Slurp(Log(odd, i));
    refused += WEXITSTATUS(status) == 2;
  }
  EXPECT_GE(refused, 1);
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.GetRun(odd.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
  v1::Run failed = coord_.GetRun(odd.run_id());
  EXPECT_NE(failed.reason().message().find("--global-batch-size 3 is not a multiple of --batch-size 1 x 2 rank(s) = 2"),
            std::string::npos)
      << failed.reason().message();
  EXPECT_EQ(failed.step(), 0);
}

// --zero 1 partitions AdamW's moments across the ranks: the losses are --zero 0's (the same
// elementwise AdamW) at 4 and at 2 ranks, every rank writes its share of each checkpoint in one
// sharded round, and a crashed run continues at another world size, or with the other --zero, with
// the losses of the uninterrupted run: each rank regathers its new range from the files that cover
// it (or cuts it from a --zero 0 optimizer.pt). 16 steps in the suite, for its time; at 50 steps it
// passed as well (2026-11-28).
TEST_F(TrainerE2ETest, ZeroOneHasTheLossesOfZeroZeroAndResumesAtAnotherWorldSize) {
  const std::vector<std::string> args = {"--max-steps",  "16",   "--ckpt-freq",         "8", "--seed",     "3",
                                         "--lr",         "1e-3", "--eval-split",        "0", "--dropout",  "0",
                                         "--batch-size", "1",    "--global-batch-size", "4", "--log-freq", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto run_to_end = [&](const std::string& name, int ranks, const std::string& zero) {
    auto run = Submit(name, ranks);
    auto p = Start(run, ranks, with({"--zero", zero}));
    EXPECT_NO_FATAL_FAILURE(ExpectExit(run, p, 0));
    return run;
  };
  // `got_run`'s losses of steps [first, last] against `want_run`'s (16 steps, uninterrupted).
  auto expect_same_losses = [&](const v1::SubmitRunResponse& want_run, const v1::SubmitRunResponse& got_run, int first,
                                int last, double tolerance) {
    auto want = coord_.Metrics(want_run.run_id(), "loss", 0);
    auto got = coord_.Metrics(got_run.run_id(), "loss", 0);
    ASSERT_EQ(want.size(), 16u);
    ASSERT_EQ(got.size(), static_cast<size_t>(last - first + 1));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].step(), first + static_cast<int64_t>(i));
      EXPECT_NEAR(got[i].value(), want[first - 1 + i].value(), tolerance) << "step " << got[i].step();
    }
  };
  // Crashes after step 8 (checkpointed) at `from` ranks, resumes at `to`; returns both runs.
  auto crash_and_resume = [&](const std::string& name, int from, const std::string& zero, int to,
                              const std::string& resumed_zero) {
    auto crashed = Submit(name, from);
    auto pc = Start(crashed, from, with({"--zero", zero, "--exit-after-step", "8"}));
    EXPECT_NO_FATAL_FAILURE(ExpectExit(crashed, pc, 137));
    EXPECT_TRUE(
        testing::WaitFor([&] { return coord_.GetRun(crashed.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
    auto resumed = Submit(name, to);
    EXPECT_EQ(resumed.resume_step(), 8);
    auto pr = Start(resumed, to, with({"--zero", resumed_zero}));
    EXPECT_NO_FATAL_FAILURE(ExpectExit(resumed, pr, 0));
    return std::make_pair(crashed, resumed);
  };
  auto plain_four = run_to_end("zero0-4", 4, "0");
  auto four = run_to_end("zero1-4", 4, "1");
  auto two = run_to_end("zero1-2", 2, "1");
  expect_same_losses(plain_four, four, 1, 16, 1e-5);
  std::string log = testing::Slurp(Log(four, 3));
  EXPECT_NE(log.find("ZeRO-1: rank 3 keeps the AdamW moments of elements ["), std::string::npos) << log;
  // What --zero 1 is for: each rank holds a quarter of the moments, and together all of them.
  const double whole = coord_.Metrics(plain_four.run_id(), "optimizer_state_bytes", 0).back().value();
  EXPECT_GT(whole, 0);
  double together = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const double mine = coord_.Metrics(four.run_id(), "optimizer_state_bytes", rank).back().value();
    EXPECT_LE(mine, whole / 4 + 2 * 4 * 3) << "rank " << rank;  // ceil(numel / 4) elements of each moment
    together += mine;
  }
  EXPECT_EQ(together, whole);
  // At 2 ranks: --zero 0 to step 8, then its optimizer.pt resumed with --zero 1.
  auto [plain_two, plain_two_resumed] = crash_and_resume("zero0-2-to-zero1", 2, "0", 2, "1");
  expect_same_losses(two, plain_two, 1, 8, 1e-5);
  expect_same_losses(two, plain_two_resumed, 9, 16, 1e-4);

  // Each of the 4 ranks wrote its share into one round: one manifest.json lists them all.
  nlohmann::json manifest =
      nlohmann::json::parse(testing::Slurp(four.exp_dir() + "/checkpoints/step-16/manifest.json"));
  EXPECT_EQ(manifest["sharded"], true);
  EXPECT_EQ(manifest["world_size"], 4);
  EXPECT_EQ(manifest["layout"]["zero"], 1);
  EXPECT_EQ(manifest["layout"]["ranges"].size(), 4u);
  std::set<int> moment_ranks;
  for (const auto& f : manifest["files"]) {
    if (absl::StartsWith(f["name"].get<std::string>(), "optimizer-zero1-rank"))
      moment_ranks.insert(f["rank"].get<int>());
  }
  EXPECT_EQ(moment_ranks, (std::set<int>{0, 1, 2, 3}));

  expect_same_losses(four, crash_and_resume("zero1-4-to-2", 4, "1", 2, "1").second, 9, 16, 1e-4);
  // Without --zero, at 4 ranks: every rank's moments regathered into one AdamW.
  expect_same_losses(two, crash_and_resume("zero1-2-to-zero0-4", 2, "1", 4, "0").second, 9, 16, 1e-4);
}

TEST_F(TrainerE2ETest, TinyGpt2LearnsAlpaca) {
  auto run = Submit("learn", 1);
  auto p = Start(run, 1,
                 {"--max-steps", "200", "--batch-size", "8", "--lr", "2e-3", "--warmup-steps", "20", "--eval-freq",
                  "50", "--eval-split", "0.02", "--eval-batches", "4", "--log-freq", "10", "--threads", "2"});
  ASSERT_NO_FATAL_FAILURE(ExpectExit(run, p, 0, absl::Minutes(5)));
  auto eval = coord_.Metrics(run.run_id(), "eval_loss");
  ASSERT_EQ(eval.size(), 4u);  // steps 50, 100, 150, 200
  // An untrained model scores ln(50257) ≈ 10.8. Measured here (1 and 2 threads alike): 6.32 at
  // step 50 and 4.97 at step 200; the bounds leave headroom for other BLAS builds.
  EXPECT_LT(eval.back().value(), 5.8);
  EXPECT_LT(eval.back().value(), eval.front().value() - 0.8);
  auto ppl = coord_.Metrics(run.run_id(), "perplexity");
  EXPECT_NEAR(ppl.back().value(), std::exp(eval.back().value()), 1e-6 * ppl.back().value());
  for (const char* metric : {"lr", "grad_norm", "tokens_per_s", "step_time_s", "cpu_time_s", "data_time_s", "epoch",
                             "tokens_seen", "rss_bytes", "peak_rss_bytes", "optimizer_state_bytes"}) {
    EXPECT_FALSE(coord_.Metrics(run.run_id(), metric).empty()) << metric;
  }
  // Each logged step's process CPU is the whole step's: a forward and backward pass take some.
  for (const auto& point : coord_.Metrics(run.run_id(), "cpu_time_s")) {
    EXPECT_GT(point.value(), 0) << "step " << point.step();
  }
  v1::Run status = coord_.GetRun(run.run_id());
  EXPECT_EQ(status.state(), v1::SUCCEEDED);
  EXPECT_EQ(status.step(), 200);
  EXPECT_EQ(status.latest_checkpoint_step(), 200);
}

// --profile-trace writes a Chrome trace of the steps asked for where LibTorch has Kineto (a CUDA
// wheel's: scripts/gpu-check.sh reads them); Debian's LibTorch has none, and there the trainer says
// why no trace came and trains on to the end.
TEST_F(TrainerE2ETest, AProfileTraceIsWrittenOrWhyNotIsSaidAndTrainingGoesOn) {
  auto run = Submit("profile", 1);
  const std::string trace = JoinPath(tmp_.path(), "trace.json");
  auto p = Start(run, 1,
                 {"--max-steps", "6", "--batch-size", "2", "--profile-trace", trace, "--profile-first-step", "2",
                  "--profile-steps", "2"});
  ASSERT_NO_FATAL_FAILURE(ExpectExit(run, p, 0, absl::Minutes(3)));
  std::string log = testing::Slurp(Log(run, 0));
  if (log.find("wrote the trace of steps 2 to 3 to " + trace) != std::string::npos) {
    nlohmann::json events = nlohmann::json::parse(testing::Slurp(trace), nullptr, false);
    ASSERT_FALSE(events.is_discarded()) << trace;
    EXPECT_FALSE(events["traceEvents"].empty()) << trace;
  } else {
    EXPECT_NE(log.find("cannot write the trace of steps 2 to 3 to " + trace + ": "), std::string::npos) << log;
    EXPECT_NE(log.find("Kineto"), std::string::npos) << log;
  }
  EXPECT_EQ(coord_.GetRun(run.run_id()).step(), 6);
}

TEST_F(TrainerE2ETest, AKilledRankStopsTheOtherWithTheCauseNamed) {
  auto run = Submit("killed", 2);
  auto procs = Start(run, 2, {"--max-steps", "100000", "--batch-size", "2"});
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.Metrics(run.run_id(), "loss", 0).size() >= 3; }, absl::Minutes(2)))
      << testing::Slurp(Log(run, 0));
  absl::Time killed_at = absl::Now();
  procs[1]->Signal(SIGKILL);
  int status = procs[0]->Wait(absl::Minutes(1));
  absl::Duration took = absl::Now() - killed_at;
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);  // stopped by the coordinator
  std::string log = testing::Slurp(Log(run, 0));
  EXPECT_NE(log.find("stopping: "), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("no heartbeat"), std::string::npos) << log;
  // Declared dead after the heartbeat timeout; the survivor told within two intervals after that
  // (plus scheduling slack on a loaded machine).
  EXPECT_LT(took, kHeartbeatTimeout + 2 * kHeartbeatInterval + absl::Seconds(3));
  v1::Run s = coord_.GetRun(run.run_id());
  EXPECT_EQ(s.state(), v1::FAILED);
  EXPECT_EQ(s.reason().rank(), 1);
  EXPECT_EQ(s.reason().kind(), v1::Failure::HEARTBEAT_TIMEOUT);
}

// srun's order when a task dies: the dead task first, its peers SIGTERMed a moment later. The
// peer goes quiet by a signal it reports; the dead rank is named, the peer listed as a victim.
TEST_F(TrainerE2ETest, ARankStoppedAfterAPeerDiedIsAVictimNotTheCause) {
  auto run = Submit("victim", 2);
  auto procs = Start(run, 2, {"--max-steps", "100000", "--batch-size", "2"});
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.Metrics(run.run_id(), "loss", 0).size() >= 3; }, absl::Minutes(2)))
      << testing::Slurp(Log(run, 0));
  procs[1]->Signal(SIGKILL);
  absl::SleepFor(absl::Milliseconds(20));  // srun's delay between the two, as measured under Slurm
  procs[0]->Signal(SIGTERM);
  int status = procs[0]->Wait(absl::Minutes(1));
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status) << "\n" << testing::Slurp(Log(run, 0));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);  // ends by the signal, as the scheduler expects
  std::string log = testing::Slurp(Log(run, 0));
  EXPECT_NE(log.find("stopped by SIGTERM from outside"), std::string::npos) << log;
  v1::Run s;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        s = coord_.GetRun(run.run_id());
        return s.state() == v1::FAILED;
      },
      absl::Seconds(30)));
  EXPECT_EQ(s.reason().kind(), v1::Failure::HEARTBEAT_TIMEOUT);
  EXPECT_EQ(s.reason().rank(), 1);
  EXPECT_THAT(s.reason().stopped_ranks(), ::testing::ElementsAre(0));
  EXPECT_NE(s.reason().message().find("victims, not causes): rank 0"), std::string::npos) << s.reason().message();
  EXPECT_EQ(s.ranks(0).state(), v1::RankStatus::STOPPED);
  EXPECT_EQ(s.ranks(1).state(), v1::RankStatus::FAILED);
}

// Gloo writes to its peers with writev, and a write to a peer that has just died raises SIGPIPE.
// Gloo expects the EPIPE the write then returns (Python ignores the signal); a trainer the signal
// killed left no log line and no report, and the run lost the victim it should have listed (seen
// in SlurmTest.AKilledTrainerRestartsTheGroupInsideTheAllocation: srun ended with 141). The signal
// sent from outside stands for that write: both trainers train on and the run succeeds.
TEST_F(TrainerE2ETest, TheSignalOfAWriteToADeadPeerDoesNotKillATrainer) {
  constexpr int kSteps = 60;
  auto run = Submit("sigpipe", 2);
  auto procs = Start(run, 2, {"--max-steps", absl::StrCat(kSteps), "--batch-size", "2", "--eval-split", "0"});
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.Metrics(run.run_id(), "loss", 0).size() >= 2; }, absl::Minutes(2)))
      << testing::Slurp(Log(run, 0));
  for (auto& p : procs) p->Signal(SIGPIPE);
  // Still training when the signal came: steps remained to report.
  ASSERT_LT(coord_.Metrics(run.run_id(), "loss", 0).size(), static_cast<size_t>(kSteps));
  ASSERT_NO_FATAL_FAILURE(ExpectExit(run, procs, 0));
  EXPECT_EQ(coord_.GetRun(run.run_id()).state(), v1::SUCCEEDED);
  EXPECT_EQ(coord_.Metrics(run.run_id(), "loss", 0).size(), static_cast<size_t>(kSteps));
}

// A rank stopped from outside while the others train on (a user's kill, an OOM killer's polite
// cousin): once the heartbeat timeout passes with nothing else failing, the stop is the cause.
TEST_F(TrainerE2ETest, AStopNothingElseExplainsIsTheCause) {
  auto run = Submit("terminated", 2);
  auto procs = Start(run, 2, {"--max-steps", "100000", "--batch-size", "2"});
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.Metrics(run.run_id(), "loss", 0).size() >= 3; }, absl::Minutes(2)))
      << testing::Slurp(Log(run, 0));
  procs[0]->Signal(SIGTERM);
  int status = procs[0]->Wait(absl::Minutes(1));
  ASSERT_TRUE(WIFSIGNALED(status)) << testing::Slurp(Log(run, 0));
  // Rank 1's collective fails at once; it waits for the coordinator's verdict and is stopped with it.
  status = procs[1]->Wait(absl::Minutes(1));
  ASSERT_TRUE(WIFEXITED(status)) << testing::Slurp(Log(run, 1));
  EXPECT_EQ(WEXITSTATUS(status), 3) << testing::Slurp(Log(run, 1));
  std::string log = testing::Slurp(Log(run, 1));
  EXPECT_NE(log.find("stopping: "), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0"), std::string::npos) << log;
  EXPECT_NE(log.find("was stopped by SIGTERM"), std::string::npos) << log;
  v1::Run s = coord_.GetRun(run.run_id());
  EXPECT_EQ(s.state(), v1::FAILED);
  EXPECT_EQ(s.reason().kind(), v1::Failure::TERMINATED);
  EXPECT_EQ(s.reason().rank(), 0);
  EXPECT_NE(s.reason().message().find("was stopped by SIGTERM"), std::string::npos) << s.reason().message();
  EXPECT_EQ(s.ranks(0).state(), v1::RankStatus::FAILED);
}

// dttrainer's command line and its first contact: each mistake named with what to do, no
// LibTorch backtrace.
TEST_F(TrainerE2ETest, MistakesAreNamedWithWhatToDo) {
  auto trainer = [&](std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    return testing::RunBinary("dttrainer", args, env, absl::Seconds(60));
  };
  std::vector<std::string> base = {"--coordinator", coord_.address(),
                                   "--run",         "r-0000000000000000",
                                   "--dataset",     JoinPath(testing::DataDir(), "alpaca_sample.json"),
                                   "--max-steps",   "1"};
  std::map<std::string, std::string> token = {{"DT_TOKEN", coord_.admin_token()}};
  struct Case {
    std::vector<std::string> extra;
    std::string says;
  } cases[] = {
      {{"--batch-size", "0"}, "--batch-size must be ≥ 1, got 0"},
      {{"--dropout", "2"}, "--dropout must be in [0, 1), got 2"},
      {{"--beta1", "5"}, "--beta1 must be in [0, 1), got 5"},
      {{"--eval-batches", "0"}, "--eval-batches must be ≥ 1, got 0"},
      {{"--rendezvous-timeout", "0"}, "--rendezvous-timeout: must be in 1..604800, got 0"},
      {{"--bogus"}, "dttrainer: unknown argument --bogus"},
      {{"--global-batch-size", "-3"}, "--global-batch-size must be ≥ 1, got -3"},
      {{"--global-batch-size", "8", "--grad-accum", "2"}, "give --global-batch-size or --grad-accum, not both"},
      {{"--zero", "2"}, "--zero 2 is not offered: dttrainer has stage 0"},
      {{"--checkpoint-io", "fast"}, "--checkpoint-io: fast not in {auto,write-behind,direct,buffered}"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    CommandResult r = trainer(args, token);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(c.extra, " ") << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << absl::StrJoin(c.extra, " ") << "\n" << r.output;
  }
  CommandResult diff = trainer({"ckpt-diff", "/nonexistent", tmp_.path()});
  EXPECT_NE(diff.exit_code, 0);
  EXPECT_NE(diff.output.find("/nonexistent is not a checkpoint directory (no model.pt)"), std::string::npos)
      << diff.output;
  EXPECT_EQ(diff.output.find("frame #"), std::string::npos) << diff.output;  // no C++ backtrace
  // A coordinator that is not there: said while waiting, and at the end what to check.
  std::vector<std::string> away = base;
  away[1] = "127.0.0.1:1";
  away.insert(away.end(), {"--rendezvous-timeout", "2"});
  CommandResult unreachable = trainer(away, token);
  EXPECT_EQ(unreachable.exit_code, 1) << unreachable.output;
  EXPECT_NE(unreachable.output.find("cannot be reached now"), std::string::npos) << unreachable.output;
  EXPECT_NE(unreachable.output.find("is dtcoord running? check --coordinator/DT_COORDINATOR"), std::string::npos)
      << unreachable.output;
  // An unknown token: where the right one comes from.
  CommandResult bad_token = trainer(base, {{"DT_TOKEN", "not-a-token"}});
  EXPECT_NE(bad_token.output.find("set DT_RUN_TOKEN from dtctl submit"), std::string::npos) << bad_token.output;
}

// A checkpoint file system that fills up mid-run: the round aborts cleanly (no SIGABRT from
// torch's writer), the run fails at once with its restarts unspent, the failure names the full
// disk and the file, and `latest` still names a complete checkpoint that verifies.
TEST_F(TrainerE2ETest, AFullDiskStopsTheRunWithTheCauseNamedAndLatestIntact) {
  std::string small = tmp_.Sub("small-fs");
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64m,mode=0755") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root with CAP_SYS_ADMIN";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{small};
  auto run = coord_.Submit(testing::MakeSpec("full", small, 1, 2, /*max_restarts=*/2));
  auto procs = Start(run, 2, {"--max-steps", "100000", "--ckpt-freq", "2", "--batch-size", "2", "--eval-split", "0"});
  ASSERT_TRUE(
      testing::WaitFor([&] { return coord_.GetRun(run.run_id()).latest_checkpoint_step() >= 2; }, absl::Minutes(2)))
      << testing::Slurp(Log(run, 0));
  // Fill the file system, leaving 64 KiB: the next checkpoint cannot fit.
  struct statvfs fs;
  ASSERT_EQ(::statvfs(small.c_str(), &fs), 0);
  int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  int ballast = ::open((small + "/ballast").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(ballast, 0);
  ASSERT_EQ(::posix_fallocate(ballast, 0, free_bytes - (64 << 10)), 0);
  ::close(ballast);

  for (size_t i = 0; i < procs.size(); ++i) {
    int status = procs[i]->Wait(absl::Minutes(2));
    ASSERT_NE(status, -1) << testing::Slurp(Log(run, i));
    EXPECT_TRUE(WIFEXITED(status)) << "rank " << i << " died by signal " << WTERMSIG(status) << "\n"
                                   << testing::Slurp(Log(run, i));
  }
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.GetRun(run.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
  v1::Run s = coord_.GetRun(run.run_id());
  EXPECT_EQ(s.restarts(), 0);  // two were allowed; a restart would meet the same full disk
  EXPECT_TRUE(s.reason().fatal());
  EXPECT_EQ(s.reason().rank(), 0);
  EXPECT_EQ(s.reason().exception_type(), "StorageFullError");
  EXPECT_NE(s.reason().message().find("no space left on device writing " + small + "/full/checkpoints/step-"),
            std::string::npos)
      << s.reason().message();
  // `latest` names a complete checkpoint whose files match its manifest.
  std::string ckpts = small + "/full/checkpoints";
  std::string latest = std::filesystem::read_symlink(ckpts + "/latest").string();
  EXPECT_EQ(latest, absl::StrCat("step-", s.latest_checkpoint_step()));
  nlohmann::json manifest =
      nlohmann::json::parse(testing::Slurp(ckpts + "/" + latest + "/manifest.json"), nullptr, false);
  ASSERT_TRUE(manifest.contains("files")) << manifest;
  ASSERT_EQ(manifest["files"].size(), 4u);
  for (const auto& f : manifest["files"]) {
    auto digest = Sha256File(ckpts + "/" + latest + "/" + f["name"].get<std::string>());
    ASSERT_TRUE(digest.ok()) << digest.status();
    EXPECT_EQ(*digest, f["sha256"].get<std::string>()) << f;
  }
  for (const auto& e : std::filesystem::directory_iterator(ckpts)) {
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace dt
