// The claim that makes one of the ranks told to requeue or cancel a job whose batch host is lost
// act (client/slurm_job.h): dttrainer, dtrun and the Python module claim the same file.
#include "client/slurm_job.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// SLURM_RESTART_COUNT as a requeued job's processes see it, restored afterwards.
class RestartCount {
 public:
  explicit RestartCount(const char* count) {
    if (const char* old = ::getenv("SLURM_RESTART_COUNT")) old_ = old;
    ::setenv("SLURM_RESTART_COUNT", count, 1);
  }
  ~RestartCount() {
    if (old_.empty()) {
      ::unsetenv("SLURM_RESTART_COUNT");
    } else {
      ::setenv("SLURM_RESTART_COUNT", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

// Ranks on several nodes are told at once: exactly one claims the job, and the others learn who.
TEST(JobClaimTest, OneOfManyClaimsTheJobAndTheOthersAreToldWho) {
  testing::TempDir exp;
  RestartCount restart("0");
  constexpr int kRanks = 16;
  std::vector<absl::StatusOr<std::optional<std::string>>> claims(kRanks, std::optional<std::string>());
  std::vector<std::thread> ranks;
  for (int k = 0; k < kRanks; ++k) {
    ranks.emplace_back([&, k] {
      claims[k] = ClaimTheJobOfTheLostBatchHost(exp.path(), "4242", 3, absl::StrCat("rank ", k, " requeues"));
    });
  }
  for (std::thread& t : ranks) t.join();
  int claimed = -1;
  for (int k = 0; k < kRanks; ++k) {
    ASSERT_TRUE(claims[k].ok()) << claims[k].status();
    if (claims[k]->has_value()) continue;
    EXPECT_EQ(claimed, -1) << "ranks " << claimed << " and " << k << " both claimed the job";
    claimed = k;
  }
  ASSERT_NE(claimed, -1) << "no rank claimed the job";
  const std::string who = absl::StrCat("rank ", claimed, " requeues");
  EXPECT_EQ(testing::Slurp(JoinPath(exp.path(), "logs/slurm-job-4242-restart-0-generation-3")), who + "\n");
  absl::StatusOr<std::optional<std::string>> late = ClaimTheJobOfTheLostBatchHost(exp.path(), "4242", 3, "late");
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->value_or("claimed by me"), who);
  // Another generation's ranks were told of another loss: theirs is a claim of its own.
  absl::StatusOr<std::optional<std::string>> other = ClaimTheJobOfTheLostBatchHost(exp.path(), "4242", 4, "gen 4");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(*other, std::nullopt);
}

// A claim read while its creator still writes it (empty) is a claim all the same.
TEST(JobClaimTest, AnEmptyClaimIsAClaim) {
  testing::TempDir exp;
  RestartCount restart("0");
  ASSERT_TRUE(MakeDirs(JoinPath(exp.path(), "logs")).ok());
  const std::string path = JoinPath(exp.path(), "logs/slurm-job-5-restart-0-generation-0");
  ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  absl::StatusOr<std::optional<std::string>> claim = ClaimTheJobOfTheLostBatchHost(exp.path(), "5", 0, "me");
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(*claim, "claimed in " + path);
}

// The requeued job is another incarnation: a batch host it loses again is claimed afresh.
TEST(JobClaimTest, TheRequeuedJobClaimsAfresh) {
  testing::TempDir exp;
  {
    RestartCount restart("0");
    ASSERT_EQ(*ClaimTheJobOfTheLostBatchHost(exp.path(), "77", 0, "first"), std::nullopt);
  }
  RestartCount restart("1");
  absl::StatusOr<std::optional<std::string>> again = ClaimTheJobOfTheLostBatchHost(exp.path(), "77", 0, "second");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, std::nullopt);
  EXPECT_EQ(testing::Slurp(JoinPath(exp.path(), "logs/slurm-job-77-restart-1-generation-0")), "second\n");
  // Another job in the same experiment directory is its own claim.
  EXPECT_EQ(*ClaimTheJobOfTheLostBatchHost(exp.path(), "78", 0, "other"), std::nullopt);
}

// dtrun and the dt module in one of its ranks are both told: the module claims the same file, so
// only one of the two acts. A SLURM_RESTART_COUNT that is not a count reads 0 on both sides.
TEST(JobClaimTest, TheDtModuleClaimsTheSameFileAsDtrun) {
  for (const char* count : {"2", "", "x1", "1234567890", "\xd9\xa3"}) {
    testing::TempDir exp;
    RestartCount restart(count);
    ASSERT_EQ(*ClaimTheJobOfTheLostBatchHost(exp.path(), "9_1", 5, "dtrun on n2 cancels"), std::nullopt);
    const std::string python = R"(
import dt
print("MODULE:", dt._claim_job_of_lost_batch_host("9_1", 5, "module"))
print("MODULE:", dt._claim_job_of_lost_batch_host("10", 5, "module claims 10"))
)";
    absl::StatusOr<CommandResult> r =
        RunCommand({"/usr/bin/python3", "-c", python}, absl::Minutes(1),
                   {{"PYTHONPATH", JoinPath(DT_BINARY_DIR, "../python")}, {"DT_EXPERIMENT_DIR", exp.path()}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->output;
    EXPECT_THAT(r->output, HasSubstr("MODULE: dtrun on n2 cancels\nMODULE: None\n")) << "count " << count;
    absl::StatusOr<std::optional<std::string>> ten = ClaimTheJobOfTheLostBatchHost(exp.path(), "10", 5, "dtrun");
    ASSERT_TRUE(ten.ok()) << ten.status();
    EXPECT_EQ(*ten, "module claims 10") << "count " << count;
    const std::string named = std::string(count) == "2" ? "2" : "0";
    EXPECT_TRUE(std::filesystem::exists(JoinPath(exp.path(), "logs/slurm-job-9_1-restart-" + named + "-generation-5")))
        << "count " << count;
  }
}

// The dt module carries out a claim it won while dtrun, which found the claim taken, stops its
// workers: dtrun's SIGTERM (to the process, taken by whichever thread) waits until it is done, and
// the command it runs is not ended by it either.
TEST(JobClaimTest, TheDtModuleCarriesOutItsClaimThroughDtrunsStop) {
  const std::string python = R"py(
import os, signal, subprocess, sys, threading, time
import dt
threading.Thread(target=lambda: time.sleep(30), daemon=True).start()
def act():
    os.kill(os.getpid(), signal.SIGTERM)
    child = subprocess.run([sys.executable, "-c",
                            "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('COMMAND DONE')"],
                           capture_output=True, text=True)
    print(child.stdout.strip(), flush=True)
    time.sleep(0.2)
    print("ACTED", flush=True)
dt._unstopped(act)
print("NOT STOPPED", flush=True)
)py";
  absl::StatusOr<CommandResult> r = RunCommand({"/usr/bin/python3", "-c", python}, absl::Minutes(1),
                                               {{"PYTHONPATH", JoinPath(DT_BINARY_DIR, "../python")}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->output, HasSubstr("COMMAND DONE\nACTED\n"));
  EXPECT_THAT(r->output, Not(HasSubstr("NOT STOPPED")));  // the SIGTERM, held off, ends it after
  EXPECT_EQ(r->exit_code, -1) << r->output;               // by the signal
}

// A claim that cannot be made says why: the caller leaves a requeue to the user and cancels anyway.
TEST(JobClaimTest, AClaimThatCannotBeMadeSaysWhy) {
  testing::TempDir exp;
  absl::StatusOr<std::optional<std::string>> bad_id = ClaimTheJobOfTheLostBatchHost(exp.path(), "1;rm -rf /", 0, "x");
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::optional<std::string>> no_dir = ClaimTheJobOfTheLostBatchHost("", "12", 0, "x");
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_dir.status().message(), HasSubstr("experiment directory"));
  // logs/ is a file here: nothing can be created under it.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(exp.path(), "logs"), "not a directory").ok());
  absl::StatusOr<std::optional<std::string>> blocked = ClaimTheJobOfTheLostBatchHost(exp.path(), "12", 0, "x");
  EXPECT_FALSE(blocked.ok());
  EXPECT_THAT(blocked.status().message(), HasSubstr(JoinPath(exp.path(), "logs")));
}

}  // namespace
}  // namespace dt
