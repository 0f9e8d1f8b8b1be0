// SQLite persistence round trip.
#include <gtest/gtest.h>

#include "common/fs.h"
#include "coordinator/state_db.h"
#include "tests/test_util.h"

namespace dt {
namespace {

TEST(StateDb, RoundTripsRunsRanksFailuresCheckpointsAndMetrics) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "state.db");
  {
    auto db = StateDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    StoredRun run;
    run.run.set_run_id("r-0000000000000001");
    run.run.set_state(v1::RUNNING);
    run.run.set_generation(2);
    run.run.mutable_spec()->set_experiment_name("exp");
    run.run.set_exp_dir("/tmp/exp");
    run.token_sha256 = "abc";
    run.join_key = "exp@slurm-1";
    ASSERT_TRUE((*db)->SaveRun(run).ok());
    run.run.set_state(v1::RESTARTING);
    ASSERT_TRUE((*db)->SaveRun(run).ok());  // an update, not a second row
    std::vector<v1::RankStatus> ranks(2);
    ranks[0].set_rank(0);
    ranks[0].set_node("n1");
    ranks[1].set_rank(1);
    ranks[1].set_step(42);
    ASSERT_TRUE((*db)->SaveRanks("r-0000000000000001", ranks).ok());
    v1::Failure f;
    f.set_rank(1);
    f.set_message("boom");
    ASSERT_TRUE((*db)->AddFailure("r-0000000000000001", f).ok());
    v1::CheckpointInfo c;
    c.set_step(10);
    c.set_path("/tmp/exp/checkpoints/step-10");
    ASSERT_TRUE((*db)->SaveCheckpoint("r-0000000000000001", c).ok());
    c.set_step(20);
    ASSERT_TRUE((*db)->SaveCheckpoint("r-0000000000000001", c).ok());
    ASSERT_TRUE((*db)->DeleteCheckpoint("r-0000000000000001", 10).ok());
    v1::MetricPoint p;
    p.set_step(3);
    p.set_time(1.5);
    (*p.mutable_values())["loss"] = 2.5;
    (*p.mutable_values())["lr"] = 0.1;
    ASSERT_TRUE((*db)->AppendMetrics("r-0000000000000001", 1, {&p}).ok());
    (*p.mutable_values())["loss"] = 2.25;  // resent or re-logged: replaces
    ASSERT_TRUE((*db)->AppendMetrics("r-0000000000000001", 1, {&p}).ok());
  }
  auto db = StateDb::Open(path);  // a restarted coordinator
  ASSERT_TRUE(db.ok());
  auto runs = (*db)->LoadRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  const LoadedRun& r = (*runs)[0];
  EXPECT_EQ(r.stored.run.state(), v1::RESTARTING);
  EXPECT_EQ(r.stored.run.generation(), 2);
  EXPECT_EQ(r.stored.token_sha256, "abc");
  EXPECT_EQ(r.stored.join_key, "exp@slurm-1");
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[1].step(), 42);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].message(), "boom");
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_EQ(r.checkpoints[0].step(), 20);
  auto loss = (*db)->QueryMetrics("r-0000000000000001", "loss", std::nullopt, 0, 0);
  ASSERT_TRUE(loss.ok());
  ASSERT_EQ(loss->size(), 1u);
  EXPECT_EQ((*loss)[0].value(), 2.25);
  EXPECT_EQ((*loss)[0].rank(), 1);
  auto all = (*db)->QueryMetrics("r-0000000000000001", "", std::nullopt, 0, 0);
  EXPECT_EQ(all->size(), 2u);
  EXPECT_TRUE((*db)->QueryMetrics("r-0000000000000001", "", 0, 0, 0)->empty());
}

}  // namespace
}  // namespace dt
