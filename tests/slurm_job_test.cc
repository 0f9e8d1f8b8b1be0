// The claim that makes one of the ranks told to requeue or cancel a job whose batch host is lost
// act (client/slurm_job.h): dttrainer, dtrun and the Python module claim the same file.
#include "client/slurm_job.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
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
      claims[k] = ClaimTheJobOfTheLostBatchHost(exp.path(), "4242", absl::StrCat("rank ", k, " requeues"));
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
  EXPECT_EQ(testing::Slurp(JoinPath(exp.path(), "logs/slurm-job-4242-restart-0")), who + "\n");
  // A claim read while its creator still writes it is a claim all the same: none is taken twice.
  absl::StatusOr<std::optional<std::string>> late = ClaimTheJobOfTheLostBatchHost(exp.path(), "4242", "late");
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->value_or("claimed by me"), who);
}

// The requeued job is another incarnation: a batch host it loses again is claimed afresh.
TEST(JobClaimTest, TheRequeuedJobClaimsAfresh) {
  testing::TempDir exp;
  {
    RestartCount restart("0");
    ASSERT_EQ(*ClaimTheJobOfTheLostBatchHost(exp.path(), "77", "first"), std::nullopt);
  }
  RestartCount restart("1");
  absl::StatusOr<std::optional<std::string>> again = ClaimTheJobOfTheLostBatchHost(exp.path(), "77", "second");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, std::nullopt);
  EXPECT_EQ(testing::Slurp(JoinPath(exp.path(), "logs/slurm-job-77-restart-1")), "second\n");
  // Another job in the same experiment directory is its own claim.
  EXPECT_EQ(*ClaimTheJobOfTheLostBatchHost(exp.path(), "78", "other"), std::nullopt);
}

// dtrun and the dt module in one of its ranks are both told: the module claims the same file, so
// only one of the two acts.
TEST(JobClaimTest, TheDtModuleClaimsTheSameFileAsDtrun) {
  testing::TempDir exp;
  RestartCount restart("2");
  ASSERT_EQ(*ClaimTheJobOfTheLostBatchHost(exp.path(), "9_1", "dtrun on n2 cancels"), std::nullopt);
  const std::string python = R"(
import dt
print("MODULE:", dt._claim_job_of_lost_batch_host("9_1", "module"))
print("MODULE:", dt._claim_job_of_lost_batch_host("10", "module claims 10"))
)";
  absl::StatusOr<CommandResult> r =
      RunCommand({"/usr/bin/python3", "-c", python}, absl::Minutes(1),
                 {{"PYTHONPATH", JoinPath(DT_BINARY_DIR, "../python")}, {"DT_EXPERIMENT_DIR", exp.path()}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_THAT(r->output, HasSubstr("MODULE: dtrun on n2 cancels\nMODULE: None\n"));
  absl::StatusOr<std::optional<std::string>> ten = ClaimTheJobOfTheLostBatchHost(exp.path(), "10", "dtrun");
  ASSERT_TRUE(ten.ok()) << ten.status();
  EXPECT_EQ(*ten, "module claims 10");
}

// A claim that cannot be made says why; the caller then acts without one.
TEST(JobClaimTest, AClaimThatCannotBeMadeSaysWhy) {
  testing::TempDir exp;
  absl::StatusOr<std::optional<std::string>> bad_id = ClaimTheJobOfTheLostBatchHost(exp.path(), "1;rm -rf /", "x");
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::optional<std::string>> no_dir = ClaimTheJobOfTheLostBatchHost("", "12", "x");
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_dir.status().message(), HasSubstr("experiment directory"));
  // logs/ is a file here: nothing can be created under it.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(exp.path(), "logs"), "not a directory").ok());
  absl::StatusOr<std::optional<std::string>> blocked = ClaimTheJobOfTheLostBatchHost(exp.path(), "12", "x");
  EXPECT_FALSE(blocked.ok());
  EXPECT_THAT(blocked.status().message(), HasSubstr(JoinPath(exp.path(), "logs")));
}

}  // namespace
}  // namespace dt
