// dttrainer on a GPU, end to end: a real dtcoord, a trainer whose model and AdamW state live on
// cuda:<local rank>, an NCCL process group initialised through the coordinator's store, checkpoints
// of device state, and an exact resume. Skipped (saying why) where this dttrainer was built without
// NCCL or sees no CUDA device: CI's machines, and every CPU build. Run it on a GPU machine with the
// CUDA build (scripts/build.sh --torch-dir ..., see README "GPUs").
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;

class TrainerCudaE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<CommandResult> version =
        RunCommand({testing::BinaryPath("dttrainer"), "--version"}, absl::Minutes(1));
    ASSERT_TRUE(version.ok() && version->exit_code == 0)
        << (version.ok() ? version->output : version.status().ToString());
    version_ = version->output;
    if (version_.find(" nccl (") == std::string::npos || version_.find("(0 CUDA devices)") != std::string::npos) {
      GTEST_SKIP() << "this dttrainer has no NCCL or sees no CUDA device: " << version_;
    }
  }

  std::string version_;
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  CoordinatorProcess coord_{tmp_.path(),
                            {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "5s", "--hang-timeout", "2m",
                             "--rendezvous-timeout", "1m"}};

  v1::SubmitRunResponse Submit(const std::string& name) {
    return coord_.Submit(testing::MakeSpec(name, save_dir_, 1, 1));
  }

  std::string Log(const v1::SubmitRunResponse& run) { return testing::TrainerLog(tmp_.path(), run, 0); }

  // One trainer of the run (local rank 0: cuda:0 with NCCL); waits for it and expects `code`.
  void Train(const v1::SubmitRunResponse& run, const std::vector<std::string>& args, int code) {
    auto procs = testing::StartTrainers(coord_, run, 1, 1, args, tmp_.path());
    int status = procs[0]->Wait(absl::Minutes(5));
    ASSERT_NE(status, -1) << "the trainer did not finish:\n" << testing::Slurp(Log(run));
    ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status) << "\n" << testing::Slurp(Log(run));
    ASSERT_EQ(WEXITSTATUS(status), code) << testing::Slurp(Log(run));
  }

  // With dropout, whose masks a GPU draws from the device's generator: a run that vanishes after
  // its checkpoint at step 4 and is resumed ends bit for bit where a run that never stopped ends
  // (testing::ExpectResumeAfterACrashIsExact). `extra`: more trainer flags.
  void ExpectResumeAfterACrashIsExact(const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--max-steps",  "8", "--ckpt-freq", "4",    "--batch-size",   "2",
                                     "--seed",       "5", "--lr",        "1e-3", "--warmup-steps", "3",
                                     "--eval-split", "0", "--dropout",   "0.1",  "--backend",      "nccl"};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::ExpectResumeAfterACrashIsExact(
        coord_, save_dir_, tmp_.path(), name, args, 4, 8,
        [&](const std::string& experiment, const std::vector<std::string>& a, int code) {
          auto run = Submit(experiment);
          Train(run, a, code);
          if (code == 0) ExpectCleanNcclRun(run);
          return run;
        });
  }

  // A run on the GPU over NCCL that ended cleanly shut its NCCL group down: LibTorch 2.x warns of
  // a group never destroyed otherwise.
  void ExpectCleanNcclRun(const v1::SubmitRunResponse& run) {
    std::string log = testing::Slurp(Log(run));
    EXPECT_NE(log.find("nccl process group ready"), std::string::npos) << log;
    EXPECT_NE(log.find("device pre-flight on cuda:0"), std::string::npos) << log;
    EXPECT_NE(log.find("NCCL process group shut down"), std::string::npos) << log;
    EXPECT_EQ(log.find("has NOT been destroyed"), std::string::npos) << log;
  }
};

TEST_F(TrainerCudaE2ETest, AGpuRankTrainsOverNcclAndResumesExactlyAfterACrash) {
  ASSERT_NO_FATAL_FAILURE(ExpectResumeAfterACrashIsExact("gpu", {}));
}

// A preemption on the GPU (Slurm's SIGUSR2): the rank agrees on a step, checkpoints it and leaves
// with status 0, resumable there. A GPU rank acts on the agreement a step after it was made (its
// host does not wait for the device each step), so it stops at most a step later than a CPU rank.
TEST_F(TrainerCudaE2ETest, APreemptedGpuRankCheckpointsTheStepItStopsAtAndLeaves) {
  auto run = Submit("gpu-preempt");
  auto procs = testing::StartTrainers(
      coord_, run, 1, 1, {"--max-steps", "100000", "--ckpt-freq", "0", "--batch-size", "2", "--backend", "nccl"},
      tmp_.path());
  ASSERT_TRUE(
      testing::WaitFor([&] { return testing::Slurp(Log(run)).find("step 3/") != std::string::npos; }, absl::Minutes(3)))
      << testing::Slurp(Log(run));
  procs[0]->Signal(SIGUSR2);
  int status = procs[0]->Wait(absl::Minutes(2));
  std::string log = testing::Slurp(Log(run));
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log;
  size_t at = log.find("stopped at step ");
  ASSERT_NE(at, std::string::npos) << log;
  const int64_t step = std::atoll(log.c_str() + at + std::string("stopped at step ").size());
  EXPECT_GE(step, 3) << log;
  EXPECT_NE(log.find("checkpointed there"), std::string::npos) << log;
  EXPECT_TRUE(std::filesystem::is_directory(JoinPath(save_dir_, absl::StrCat("gpu-preempt/checkpoints/step-", step))))
      << log;
}

// bf16 autocast on the GPU: fp32 master weights and AdamW state, checkpointed whole, so the resume
// is exact as well. The straight run's step-4 copy ran on a side stream (DeviceToHostCopies) beside
// step 5: its equality with the crashed run's step 4, copied with no step after it, shows the copy
// took the state of its step. (A tiny model's copy is short; GPT-2 small's was not measured so.)
TEST_F(TrainerCudaE2ETest, ABf16GpuRunResumesExactlyAfterACrash) {
  ASSERT_NO_FATAL_FAILURE(ExpectResumeAfterACrashIsExact("gpu-bf16", {"--precision", "bf16"}));
}

// bf16 trains what fp32 trains on the GPU: over 200 steps on the same data and seed, every logged
// loss within 2% of fp32's (measured on an H200: at most 1.3%).
TEST_F(TrainerCudaE2ETest, Bf16LossesStayWithinTwoPercentOfFp32OnTheGpu) {
  std::vector<std::string> args = {"--max-steps",    "200", "--batch-size", "8", "--lr",       "2e-3",
                                   "--warmup-steps", "20",  "--eval-split", "0", "--log-freq", "10",
                                   "--backend",      "nccl"};
  std::map<std::string, std::string> runs;
  for (const char* precision : {"fp32", "bf16"}) {
    auto run = Submit(absl::StrCat("gpu-learn-", precision));
    auto run_args = args;
    run_args.insert(run_args.end(), {"--precision", precision});
    ASSERT_NO_FATAL_FAILURE(Train(run, run_args, 0));
    EXPECT_NE(testing::Slurp(Log(run)).find(absl::StrCat(precision, " on cuda:0")), std::string::npos);
    runs[precision] = run.run_id();
  }
  double worst = testing::ExpectLossesClose(coord_, runs["fp32"], runs["bf16"], 0.02, 20);
  auto bf16 = coord_.Metrics(runs["bf16"], "loss", 0);
  ASSERT_EQ(bf16.size(), 20u);
  EXPECT_LT(bf16.back().value(), bf16.front().value() - 2.0);  // it learned
  EXPECT_GT(worst, 1e-4);                                      // autocast did run the products in bf16
  std::cout << "bf16 against fp32 on the GPU: largest relative loss difference " << worst << "\n";
}

// The GPU computes what the CPU computes: the same seed, data and model give the same losses
// over Gloo on the CPU and over NCCL on the GPU, up to float rounding. (Not the parameters: AdamW's
// first steps move a weight by about the learning rate whatever its gradient's size, so a gradient
// near zero that rounds to the other sign on one device moves that weight the other way.)
TEST_F(TrainerCudaE2ETest, AGpuRunLearnsWhatTheSameRunOnTheCpuLearns) {
  std::vector<std::string> args = {"--max-steps",    "6", "--batch-size", "2", "--seed",    "9", "--lr", "1e-3",
                                   "--warmup-steps", "2", "--eval-split", "0", "--dropout", "0"};
  auto gpu = Submit("on-gpu");
  auto gpu_args = args;
  gpu_args.insert(gpu_args.end(), {"--backend", "nccl"});
  ASSERT_NO_FATAL_FAILURE(Train(gpu, gpu_args, 0));
  auto cpu = Submit("on-cpu");
  auto cpu_args = args;
  cpu_args.insert(cpu_args.end(), {"--backend", "gloo"});
  ASSERT_NO_FATAL_FAILURE(Train(cpu, cpu_args, 0));
  EXPECT_NE(testing::Slurp(Log(cpu)).find("device pre-flight on cpu"), std::string::npos);

  auto on_gpu = coord_.Metrics(gpu.run_id(), "loss", 0);
  auto on_cpu = coord_.Metrics(cpu.run_id(), "loss", 0);
  ASSERT_EQ(on_gpu.size(), 6u);
  ASSERT_EQ(on_cpu.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(on_gpu[i].value(), on_cpu[i].value(), 1e-3) << "step " << i + 1;
  EXPECT_LT(on_gpu[5].value(), on_gpu[0].value());  // it learned
}

}  // namespace
}  // namespace dt
