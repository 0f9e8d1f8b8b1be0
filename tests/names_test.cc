// Input validation: names that become directories, run ids, store keys, durations.
#include <limits>

#include <gtest/gtest.h>

#include "common/duration.h"
#include "common/names.h"
#include "common/timeout_policy.h"

namespace dt {
namespace {

TEST(ExperimentName, AcceptsOrdinaryNames) {
  for (const char* name : {"gpt2-alpaca", "run_7", "экcперимент", "a.b", "x y"}) {
    EXPECT_TRUE(ValidateExperimentName(name).ok()) << name;
  }
}

TEST(ExperimentName, RefusesWhatWouldEscapeOrBreakTheSaveDir) {
  struct Case {
    std::string name;
    const char* rule;
  } cases[] = {{"", "empty"},           {"a/b", "'/'"},
               {"..", "\"..\""},        {".", "\".\""},
               {"a..b", "\"..\""},      {std::string("a\0b", 3), "control"},
               {"a\nb", "control"},     {"-rf", "'-'"},
               {" lead", "whitespace"}, {std::string(129, 'x'), "limit of 128"},
               {"\xff\xfe", "UTF-8"}};
  for (const auto& c : cases) {
    absl::Status s = ValidateExperimentName(c.name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.rule), absl::string_view::npos) << s.message();
  }
  EXPECT_TRUE(ValidateExperimentName(std::string(128, 'x')).ok());
}

TEST(RunId, Format) {
  EXPECT_TRUE(ValidateRunId("r-0123456789abcdef").ok());
  EXPECT_FALSE(ValidateRunId("r-0123456789ABCDEF").ok());
  EXPECT_FALSE(ValidateRunId("r-0123").ok());
  EXPECT_FALSE(ValidateRunId("x-0123456789abcdef").ok());
  EXPECT_NE(ValidateRunId("").message().find("empty"), absl::string_view::npos);
}

TEST(StoreKey, LimitIsNamed) {
  EXPECT_TRUE(ValidateStoreKey(std::string(512, 'k')).ok());
  absl::Status s = ValidateStoreKey(std::string(513, 'k'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("512"), absl::string_view::npos);
  EXPECT_FALSE(ValidateStoreKey("").ok());
}

TEST(AbsolutePath, Rules) {
  EXPECT_TRUE(ValidateAbsolutePath("save dir", "/scratch/runs").ok());
  EXPECT_FALSE(ValidateAbsolutePath("save dir", "relative/runs").ok());
  EXPECT_FALSE(ValidateAbsolutePath("save dir", "/a/../b").ok());
  EXPECT_NE(ValidateAbsolutePath("save dir", "x").message().find("save dir"), absl::string_view::npos);
}

TEST(MetricName, Rules) {
  EXPECT_TRUE(ValidateMetricName("loss").ok());
  EXPECT_TRUE(ValidateMetricName("eval/loss").ok());
  EXPECT_FALSE(ValidateMetricName("1loss").ok());
  EXPECT_FALSE(ValidateMetricName("lo ss").ok());
}

TEST(NodeName, TakesHostNamesAndRefusesWhatScontrolWouldReadAsAnOption) {
  for (const char* ok : {"n1", "gpu-node-017", "c12.cluster.example", "a_b"})
    EXPECT_TRUE(ValidateNodeName(ok).ok()) << ok;
  for (const char* bad : {"", "--user=root", "-n1", "n1,n2", "n[1-3]", "n 1", "n1\n"}) {
    absl::Status s = ValidateNodeName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("node name"), std::string::npos) << s;
  }
}

TEST(Duration, ParsesUnitsAndRefusesBareNumbers) {
  EXPECT_EQ(*ParsePositiveDuration("--x", "500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParsePositiveDuration("--x", "30s"), absl::Seconds(30));
  EXPECT_EQ(*ParsePositiveDuration("--x", "10m"), absl::Minutes(10));
  EXPECT_EQ(*ParsePositiveDuration("--x", "1m30s"), absl::Seconds(90));
  absl::Status bare = ParsePositiveDuration("--hang-timeout", "30").status();
  EXPECT_EQ(bare.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bare.message().find("--hang-timeout"), absl::string_view::npos);
  EXPECT_FALSE(ParsePositiveDuration("--x", "-5s").ok());
  EXPECT_FALSE(ParsePositiveDuration("--x", "0s").ok());
  EXPECT_FALSE(ParsePositiveDuration("--x", "soon").ok());
}

// What is left of a timeout goes on the wire in whole milliseconds, rounded up: a wait sent with
// 299.7 ms left must not end before the 300 ms the caller asked for.
TEST(Duration, ATimeoutGoesOnTheWireRoundedUpToWholeMilliseconds) {
  EXPECT_EQ(TimeoutMillis(absl::Microseconds(299'700)), 300);
  EXPECT_EQ(TimeoutMillis(absl::Milliseconds(300)), 300);
  EXPECT_EQ(TimeoutMillis(absl::Nanoseconds(1)), 1);
  EXPECT_EQ(TimeoutMillis(absl::ZeroDuration()), 0);  // the run's default
  EXPECT_EQ(TimeoutMillis(absl::InfiniteDuration()), std::numeric_limits<int64_t>::max());
}

TEST(TimeoutPolicy, OrderSoTheCoordinatorNamesTheCauseFirst) {
  CoordinatorTimeouts t;
  ASSERT_TRUE(ValidateTimeouts(t).ok());
  v1::TimeoutPolicy p = DerivePolicy(t);
  EXPECT_GT(p.collective_timeout_ms(), p.hang_timeout_ms() + p.heartbeat_timeout_ms());
  EXPECT_EQ(p.store_timeout_ms(), p.init_timeout_ms());
  // A rank rides out a coordinator restart (drain up to 5 s, start, reload) before it gives up.
  EXPECT_GE(p.reconnect_timeout_ms(), p.heartbeat_timeout_ms() + 30'000);
  t.heartbeat_timeout = absl::Seconds(3);
  EXPECT_FALSE(ValidateTimeouts(t).ok());  // < 2 intervals
  t.heartbeat_timeout = absl::Minutes(20);
  EXPECT_FALSE(ValidateTimeouts(t).ok());  // hang must exceed it
}

}  // namespace
}  // namespace dt
