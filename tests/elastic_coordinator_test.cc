// Elastic runs in the coordinator (RunSpec.min_nodes), on a fake clock: a lost node shrinks the
// next generation to the nodes that remain; anything else restarts at the run's full size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_monitor.h"
#include "coordinator/prometheus_exporter.h"
#include "coordinator/rank_registration.h"
#include "tests/coordinator_fixture.h"
#include "tests/http_test_client.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorTest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::Reply;

class ElasticTest : public CoordinatorTest {
 protected:
  // A run of `nodes` x 2 that may go on with `min_nodes`.
  std::string SubmitElastic(int nodes, int min_nodes, int max_restarts = 3, v1::Scheduler scheduler = v1::LOCAL) {
    v1::RunSpec spec = testing::MakeSpec("elastic", save_dir_, nodes, 2, max_restarts);
    spec.set_scheduler(scheduler);
    spec.set_min_nodes(min_nodes);
    spec.set_max_requeues(1);
    auto r = coord_->SubmitRun(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->run_id() : "";
  }

  // Past the heartbeat timeout (30 s) with only `beating` ranks heartbeating.
  void OnlyTheseBeat(const std::string& run, const std::vector<v1::RegisterResponse>& beating) {
    for (int i = 0; i < 17; ++i) {
      Advance(absl::Seconds(2));
      for (const v1::RegisterResponse& a : beating) {
        if (State(run) != v1::RUNNING) return;
        ASSERT_TRUE(Beat(run, a, 0).ok());
      }
    }
  }

  // Rank 1 of `generation` reports an exception: a restart for a cause other than a lost node.
  void CrashRankOne(const std::string& run, int64_t generation) {
    v1::ReportErrorRequest err;
    err.set_run_id(run);
    err.set_generation(generation);
    err.set_rank(1);
    err.set_message("RuntimeError: boom");
    ASSERT_TRUE(coord_->health().ReportError(err).ok());
  }

  // The batch script's attach: job `job` runs its script on `node`, first or once requeued.
  absl::StatusOr<v1::Run> AttachBatchHost(const std::string& run, const std::string& node,
                                          const std::string& job = "123", bool requeued = false) {
    v1::AttachLaunchRequest attach;
    attach.set_run_id(run);
    attach.set_scheduler_job_id(job);
    attach.set_batch_host(node);
    attach.set_requeued(requeued);
    return coord_->AttachLaunch(attach);
  }

  // A 3-node elastic Slurm run (job 123, its batch script on `batch_host`) loses n3: the run and
  // its ranks of generation 0.
  std::pair<std::string, std::vector<v1::RegisterResponse>> LoseNodeThreeOfASlurmRun(const std::string& batch_host,
                                                                                     int max_restarts) {
    std::string run = SubmitElastic(3, 2, max_restarts, v1::SLURM);
    EXPECT_TRUE(AttachBatchHost(run, batch_host).ok());
    return {run, LoseNodeThree(run)};
  }

  // n3 is lost, then generation 1 on n1 and n2 fails for another cause: the run as it is then.
  absl::StatusOr<v1::Run> ShrinkThenCrash(const std::string& run) {
    LoseNodeThree(run);
    RegisterAll(run, 2, 2);
    CrashRankOne(run, 1);
    return coord_->GetRun(run);
  }

  // Each of `ranks` named in `which` heartbeats generation 0 and is told to STOP, with `requeue` as
  // its requeue_job and `cancel` as its cancel_job.
  void ExpectStopsNaming(const std::string& run, const std::vector<v1::RegisterResponse>& ranks,
                         std::initializer_list<int> which, const std::string& requeue, const std::string& cancel) {
    for (int k : which) {
      absl::StatusOr<v1::HeartbeatResponse> stop = Beat(run, ranks[k], 0);
      ASSERT_TRUE(stop.ok()) << stop.status();
      EXPECT_EQ(stop->directive(), v1::HeartbeatResponse::STOP) << "rank " << k;
      EXPECT_EQ(stop->requeue_job(), requeue) << "rank " << k;
      EXPECT_EQ(stop->cancel_job(), cancel) << "rank " << k;
    }
  }
  void ExpectStopsWithNoJobToActOn(const std::string& run, const std::vector<v1::RegisterResponse>& ranks,
                                   std::initializer_list<int> which) {
    ExpectStopsNaming(run, ranks, which, "", "");
  }

  // Node n3 of a 3-node run goes silent: the run goes on with n1 and n2.
  std::vector<v1::RegisterResponse> LoseNodeThree(const std::string& run) {
    auto ranks = RegisterAll(run, 3, 2);
    OnlyTheseBeat(run, {ranks[0], ranks[1], ranks[2], ranks[3]});
    return ranks;
  }
};

TEST_F(ElasticTest, ALostNodeShrinksTheNextGenerationToTheNodesThatRemain) {
  std::string run = SubmitElastic(3, 2);
  LoseNodeThree(run);
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::RESTARTING);
  EXPECT_EQ(r->generation(), 1);
  EXPECT_EQ(r->world_size(), 4);
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1", "n2"));
  EXPECT_THAT(r->lost_nodes(), ElementsAre("n3"));
  EXPECT_EQ(r->reason().kind(), v1::Failure::HEARTBEAT_TIMEOUT);
  EXPECT_THAT(r->reason().message(), HasSubstr("node n3 lost: the run goes on with 2 of its 3 nodes"));
  ASSERT_EQ(r->generations_size(), 2);
  EXPECT_EQ(r->generations(0).world_size(), 6);
  EXPECT_EQ(r->generations(1).world_size(), 4);
  EXPECT_THAT(r->generations(1).lost_nodes(), ElementsAre("n3"));

  // The lost node cannot take a seat of the shrunk generation.
  Reply<v1::RegisterResponse> late;
  coord_->registration().Register(RegisterRequest(run, "n3", 0, "n3-late"), late.pending());
  ASSERT_TRUE(late.arrived());
  EXPECT_EQ(late.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.value.status().message(), HasSubstr("not one of this generation's 2 nodes (n1, n2)"));

  // The two nodes that remain form it: four ranks, told the new world size.
  auto ranks = RegisterAll(run, 2, 2);
  EXPECT_EQ(State(run), v1::RUNNING);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(ranks[k].world_size(), 4);
    EXPECT_EQ(ranks[k].nodes(), 2);
    EXPECT_EQ(ranks[k].generation(), 1);
  }
  // Ranks of the old world's size are outside this generation.
  v1::HeartbeatRequest beyond;
  beyond.set_run_id(run);
  beyond.set_generation(1);
  beyond.set_rank(4);
  beyond.set_incarnation("n3-0");
  EXPECT_EQ(coord_->health().Heartbeat(beyond).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ReportErrorRequest err;
  err.set_run_id(run);
  err.set_generation(1);
  err.set_rank(5);
  err.set_message("boom");
  EXPECT_EQ(coord_->health().ReportError(err).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ElasticTest, AMiddleNodeLostLeavesTheOthersContiguousRanksInNodeOrder) {
  std::string run = SubmitElastic(3, 2);
  auto ranks = RegisterAll(run, 3, 2);
  OnlyTheseBeat(run, {ranks[0], ranks[1], ranks[4], ranks[5]});  // n2 silent
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1", "n3"));
  EXPECT_THAT(r->lost_nodes(), ElementsAre("n2"));
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> replies;
  for (const char* node : {"n3", "n1"}) {
    for (int slot = 0; slot < 2; ++slot) {
      replies.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
      coord_->registration().Register(RegisterRequest(run, node, slot), replies.back()->pending());
    }
  }
  for (size_t k = 0; k < replies.size(); ++k) {
    ASSERT_TRUE(replies[k]->arrived());
    ASSERT_TRUE(replies[k]->value.ok()) << replies[k]->value.status();
    const v1::RegisterResponse& a = replies[k]->value.value();
    EXPECT_EQ(a.world_size(), 4);
    EXPECT_EQ(a.rank(), k < 2 ? 2 + static_cast<int>(k) : static_cast<int>(k) - 2) << "registrant " << k;
    EXPECT_EQ(a.node_rank(), k < 2 ? 1 : 0);
  }
}

TEST_F(ElasticTest, OneSilentRankOfANodeRestartsAtFullSize) {
  std::string run = SubmitElastic(3, 2);
  auto ranks = RegisterAll(run, 3, 2);
  OnlyTheseBeat(run, {ranks[0], ranks[1], ranks[2], ranks[3], ranks[5]});  // rank 4 of n3 silent
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::RESTARTING);
  EXPECT_EQ(r->reason().rank(), 4);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
  EXPECT_THAT(r->reason().message(), Not(HasSubstr("lost")));
}

TEST_F(ElasticTest, FewerThanMinNodesLeftRestartsAtFullSize) {
  std::string run = SubmitElastic(3, 2);
  auto ranks = RegisterAll(run, 3, 2);
  OnlyTheseBeat(run, {ranks[0], ranks[1]});  // n2 and n3 silent
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::RESTARTING);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
  EXPECT_THAT(r->lost_nodes(), IsEmpty());
}

TEST_F(ElasticTest, AFixedRunNeverShrinks) {
  std::string run = Submit(3, 2, /*max_restarts=*/1);
  auto ranks = RegisterAll(run, 3, 2);
  OnlyTheseBeat(run, {ranks[0], ranks[1], ranks[2], ranks[3]});
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation(), 1);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
  EXPECT_EQ(r->generations_size(), 0);  // kept for elastic runs only
}

TEST_F(ElasticTest, AnyOtherRestartAfterAShrinkBringsTheWorldBack) {
  std::string run = SubmitElastic(3, 2);
  absl::StatusOr<v1::Run> r = ShrinkThenCrash(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation(), 2);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
  EXPECT_THAT(r->lost_nodes(), IsEmpty());
  ASSERT_EQ(r->generations_size(), 3);
  EXPECT_EQ(r->generations(2).world_size(), 6);
  // n3 is welcome again.
  auto ranks = RegisterAll(run, 3, 2);
  EXPECT_EQ(ranks[5].world_size(), 6);
  EXPECT_EQ(State(run), v1::RUNNING);
}

// Under Slurm the lost node has left the job's allocation: a restart for another cause keeps the
// nodes that remain; losing one of them below MIN forms at full size (the job is requeued).
TEST_F(ElasticTest, UnderSlurmARestartAfterAShrinkKeepsTheNodesThatRemain) {
  std::string run = SubmitElastic(3, 2, 3, v1::SLURM);
  absl::StatusOr<v1::Run> r = ShrinkThenCrash(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation(), 2);
  EXPECT_EQ(r->world_size(), 4);
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1", "n2"));
  EXPECT_THAT(r->lost_nodes(), ElementsAre("n3"));
  EXPECT_THAT(r->reason().message(), Not(HasSubstr("lost")));  // the crash, not a second shrink
  ASSERT_EQ(r->generations_size(), 3);
  EXPECT_EQ(r->generations(2).world_size(), 4);

  // n2 is lost too: below MIN 2, the next generation is the full world again.
  auto ranks = RegisterAll(run, 2, 2);
  OnlyTheseBeat(run, {ranks[0], ranks[1]});
  r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation(), 3);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
}

TEST_F(ElasticTest, ARequeueAfterAShrinkBringsTheWorldBack) {
  std::string run = SubmitElastic(3, 2);
  LoseNodeThree(run);
  auto ranks = RegisterAll(run, 2, 2);
  for (const v1::RegisterResponse& a : ranks) {
    v1::LeaveRequest leave;
    leave.set_run_id(run);
    leave.set_rank(a.rank());
    leave.set_generation(1);
    leave.set_incarnation(absl::StrCat("n", a.node_rank() + 1, "-", a.local_rank()));
    leave.set_final_step(12);
    leave.set_preempted(true);
    leave.set_signal(SIGUSR2);
    ASSERT_TRUE(coord_->health().Leave(leave).ok());
  }
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::REQUEUED);
  EXPECT_EQ(r->generation(), 2);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
}

// The batch host died: Slurm requeued the job, and its new allocation need not hold the nodes the
// old one had left. The requeued script's attach makes the shrunk next generation whole again.
TEST_F(ElasticTest, ARequeuedJobMakesTheShrunkNextGenerationWholeAgain) {
  std::string run = SubmitElastic(3, 2, 3, v1::SLURM);
  LoseNodeThree(run);
  // A process of the old job still waits in the shrunk generation.
  Reply<v1::RegisterResponse> stale;
  coord_->registration().Register(RegisterRequest(run, "n1", 0, "n1-old-job"), stale.pending());
  ASSERT_FALSE(stale.arrived());
  const v1::RunState waiting = State(run);

  absl::StatusOr<v1::Run> r = AttachBatchHost(run, "n2", "123", /*requeued=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->batch_host(), "n2");
  EXPECT_EQ(r->state(), waiting);  // the generation still waits for its ranks
  EXPECT_EQ(r->generation(), 1);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_THAT(r->generation_nodes(), IsEmpty());
  EXPECT_THAT(r->lost_nodes(), IsEmpty());
  ASSERT_EQ(r->generations_size(), 2);  // generation 1's entry is replaced, not added to
  EXPECT_EQ(r->generations(1).generation(), 1);
  EXPECT_EQ(r->generations(1).world_size(), 6);
  EXPECT_THAT(r->generations(1).lost_nodes(), IsEmpty());
  ASSERT_TRUE(stale.arrived());
  EXPECT_EQ(stale.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.value.status().message(), HasSubstr("was requeued: generation 1 forms again on its whole new"));

  // It is saved: a coordinator restart keeps the whole generation. n3 takes a seat in it.
  Reopen();
  auto ranks = RegisterAll(run, 3, 2);
  EXPECT_EQ(State(run), v1::RUNNING);
  EXPECT_EQ(ranks[5].world_size(), 6);
  EXPECT_EQ(ranks[5].generation(), 1);
  r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->restarts(), 1);  // the shrink's; the requeue spends none
}

// Attaching again changes no generation that formed (its ranks end with the old job), and none of
// a run that never shrank.
TEST_F(ElasticTest, ARequeuedAttachLeavesAFormedOrWholeGeneration) {
  std::string run = SubmitElastic(3, 2, 3, v1::SLURM);
  v1::AttachLaunchRequest attach;
  attach.set_run_id(run);
  attach.set_scheduler_job_id("123");
  attach.set_requeued(true);
  absl::StatusOr<v1::Run> r = coord_->AttachLaunch(attach);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generation(), 0);
  EXPECT_EQ(r->world_size(), 6);

  LoseNodeThree(run);
  RegisterAll(run, 2, 2);
  ASSERT_EQ(State(run), v1::RUNNING);
  r = coord_->AttachLaunch(attach);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::RUNNING);
  EXPECT_EQ(r->generation(), 1);
  EXPECT_EQ(r->world_size(), 4);
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1", "n2"));
}

TEST_F(ElasticTest, OnlyASlurmRunsJobIsRequeued) {
  std::string run = SubmitElastic(3, 2);
  LoseNodeThree(run);
  v1::AttachLaunchRequest attach;
  attach.set_run_id(run);
  attach.set_scheduler_job_id("local:42");
  attach.set_requeued(true);
  absl::StatusOr<v1::Run> r = coord_->AttachLaunch(attach);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("is not a Slurm run; only Slurm requeues a run's job"));
  r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1", "n2"));  // nothing changed
  EXPECT_TRUE(r->scheduler_job_id().empty());
}

// The batch host is lost with its node: Slurm keeps the --no-kill job RUNNING without its script,
// and nothing would launch the next generation. Every rank on a node that remains is told, in
// each STOP it gets, to requeue the job (they claim it among themselves, so one acts, and one that
// died leaves the others); no rank of the lost node is.
TEST_F(ElasticTest, TheRanksThatRemainAreToldToRequeueTheJobWhoseBatchHostIsLost) {
  auto [run, ranks] = LoseNodeThreeOfASlurmRun("n3", 3);
  ASSERT_EQ(State(run), v1::RESTARTING);

  ExpectStopsWithNoJobToActOn(run, ranks, {4});                                      // n3 comes back too late
  ExpectStopsNaming(run, ranks, {2, 0, 1, 3, 2}, /*requeue=*/"123", /*cancel=*/"");  // told again: a reply may be lost
  // In a node's heartbeat too (dtrun's).
  v1::NodeHeartbeatRequest node;
  node.set_run_id(run);
  node.set_generation(0);
  for (int k : {3, 2}) {
    v1::RankHeartbeat& beat = *node.add_ranks();
    beat.set_rank(k);
    beat.set_incarnation(absl::StrCat("n", ranks[k].node_rank() + 1, "-", ranks[k].local_rank()));
  }
  absl::StatusOr<v1::NodeHeartbeatResponse> answers = coord_->health().NodeHeartbeat(node);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_EQ(answers->ranks_size(), 2);
  for (const v1::NodeHeartbeatResponse::RankAnswer& answer : answers->ranks()) {
    EXPECT_EQ(answer.reply().directive(), v1::HeartbeatResponse::STOP);
    EXPECT_EQ(answer.reply().requeue_job(), "123") << "rank " << answer.rank();
  }

  // Once the requeued job's script attached, nobody is told any more.
  ASSERT_TRUE(AttachBatchHost(run, "n2", "123", /*requeued=*/true).ok());
  ExpectStopsWithNoJobToActOn(run, ranks, {0, 1, 2, 3});
}

// Whom the coordinator told is saved with the run: a coordinator restarted before the ranks heard
// it still tells them, and the run shows the job, its lost batch host and the nodes told.
TEST_F(ElasticTest, ARestartedCoordinatorStillTellsTheRanksToRequeueTheJob) {
  auto [run, ranks] = LoseNodeThreeOfASlurmRun("n3", 3);
  ASSERT_EQ(State(run), v1::RESTARTING);
  Reopen();
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_orphaned_job()) << r->ShortDebugString();
  EXPECT_EQ(r->orphaned_job().job(), "123");
  EXPECT_FALSE(r->orphaned_job().cancel());
  EXPECT_EQ(r->orphaned_job().batch_host(), "n3");
  EXPECT_EQ(r->orphaned_job().generation(), 0);
  EXPECT_THAT(r->orphaned_job().nodes(), ElementsAre("n1", "n2"));
  EXPECT_THAT(r->orphaned_job().ranks(), ElementsAre(0, 1, 2, 3));
  ExpectStopsNaming(run, ranks, {3, 0}, /*requeue=*/"123", /*cancel=*/"");
  ExpectStopsWithNoJobToActOn(run, ranks, {4, 5});

  // The requeued job's script attached: the record goes, and that too is saved.
  ASSERT_TRUE(AttachBatchHost(run, "n2", "123", /*requeued=*/true).ok());
  Reopen();
  r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_orphaned_job()) << r->ShortDebugString();
  ExpectStopsWithNoJobToActOn(run, ranks, {0, 1, 2, 3});
}

// The batch host is lost and the run has no restart left: it fails, and the --no-kill job would
// hold the nodes that remain until its time limit. Every rank on a node that remains is told to
// cancel the job, in every STOP it gets; the lost node's ranks are not.
TEST_F(ElasticTest, TheRanksThatRemainAreToldToCancelTheJobOfAFailedRunWhoseBatchHostIsLost) {
  auto [run, ranks] = LoseNodeThreeOfASlurmRun("n3", /*max_restarts=*/0);
  ASSERT_EQ(State(run), v1::FAILED);
  ExpectStopsWithNoJobToActOn(run, ranks, {5, 4});
  ExpectStopsNaming(run, ranks, {1, 1, 0, 2, 3}, /*requeue=*/"", /*cancel=*/"123");
  Reopen();  // the cancel stays, as the record of what was done, and is still told
  absl::StatusOr<v1::Run> after = coord_->GetRun(run);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->orphaned_job().cancel());
  ExpectStopsNaming(run, ranks, {2}, /*requeue=*/"", /*cancel=*/"123");
}

// A large run: the ranks of the first three nodes that remain are told, not every rank (each one
// claims the action with a create on the shared file system; three nodes leave spares enough).
TEST_F(ElasticTest, OnlyTheRanksOfThreeNodesThatRemainAreToldToActOnTheJob) {
  std::string run = SubmitElastic(5, 2, 3, v1::SLURM);
  ASSERT_TRUE(AttachBatchHost(run, "n1").ok());
  auto ranks = RegisterAll(run, 5, 2);
  OnlyTheseBeat(run, {ranks[2], ranks[3], ranks[4], ranks[5], ranks[6], ranks[7], ranks[8], ranks[9]});
  ASSERT_EQ(State(run), v1::RESTARTING);
  ExpectStopsNaming(run, ranks, {2, 3, 4, 5, 6, 7}, /*requeue=*/"123", /*cancel=*/"");
  ExpectStopsWithNoJobToActOn(run, ranks, {8, 9, 0, 1});
}

// A failed run whose batch host lives: its script ends the job, and no rank is told to.
TEST_F(ElasticTest, NoRankCancelsTheJobOfAFailedRunWhileTheBatchScriptLives) {
  auto [run, ranks] = LoseNodeThreeOfASlurmRun("n1", /*max_restarts=*/0);
  ASSERT_EQ(State(run), v1::FAILED);
  ExpectStopsWithNoJobToActOn(run, ranks, {0, 1, 2, 3});
}

// A requeue decided for a run that restarts is not handed out once the run was cancelled: the
// requeued job would run a cancelled run (`dtctl cancel` cancels the job itself).
TEST_F(ElasticTest, NoRankRequeuesTheJobOfARunCancelledMeanwhile) {
  auto [run, ranks] = LoseNodeThreeOfASlurmRun("n3", 3);
  ASSERT_EQ(State(run), v1::RESTARTING);
  ExpectStopsNaming(run, ranks, {2}, /*requeue=*/"123", /*cancel=*/"");  // told before the cancel
  ASSERT_TRUE(coord_->CancelRun(run, "test").ok());
  ExpectStopsWithNoJobToActOn(run, ranks, {2, 0, 1, 3});
  absl::StatusOr<v1::Run> after = coord_->GetRun(run);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_FALSE(after->has_orphaned_job());  // nor shown as a requeue to come
}

// A lost node that is not the batch host leaves the script to launch the shrunk generation.
TEST_F(ElasticTest, NoRankRequeuesWhileTheBatchScriptLives) {
  auto [run, ranks] = LoseNodeThreeOfASlurmRun("n1", 3);
  ExpectStopsWithNoJobToActOn(run, ranks, {0, 1, 2, 3});
}

TEST_F(ElasticTest, OnlyASlurmRunHasABatchHost) {
  std::string local = SubmitElastic(3, 2);
  absl::Status s = AttachBatchHost(local, "n1", "local:42").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not a Slurm run; only a Slurm job has a batch host"));
  absl::StatusOr<v1::Run> r = coord_->GetRun(local);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->scheduler_job_id(), IsEmpty());  // nothing changed
}

TEST_F(ElasticTest, ABatchHostIsANodeName) {
  std::string slurm = SubmitElastic(3, 2, 3, v1::SLURM);
  absl::Status s = AttachBatchHost(slurm, "n1 --all").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("batch host:"));
  absl::StatusOr<v1::Run> r = coord_->GetRun(slurm);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->batch_host(), IsEmpty());  // nothing changed
  EXPECT_THAT(r->scheduler_job_id(), IsEmpty());
}

TEST_F(ElasticTest, ACoordinatorRestartKeepsTheShrunkGeneration) {
  std::string run = SubmitElastic(3, 2);
  LoseNodeThree(run);
  Reopen();
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation(), 1);
  EXPECT_EQ(r->world_size(), 4);
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1", "n2"));
  EXPECT_EQ(r->generations_size(), 2);
  auto ranks = RegisterAll(run, 2, 2);
  EXPECT_EQ(ranks[3].world_size(), 4);
  EXPECT_EQ(State(run), v1::RUNNING);
}

TEST_F(ElasticTest, ShrinksAgainUntilMinNodesThenWaitsForTheFullWorld) {
  std::string run = SubmitElastic(3, 1);
  LoseNodeThree(run);
  auto ranks = RegisterAll(run, 2, 2);
  OnlyTheseBeat(run, {ranks[0], ranks[1]});  // n2 lost too: one node left, MIN is 1
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation(), 2);
  EXPECT_EQ(r->world_size(), 2);
  EXPECT_THAT(r->generation_nodes(), ElementsAre("n1"));
  EXPECT_THAT(r->lost_nodes(), ElementsAre("n3", "n2"));  // the first shrink's node is still lost
  EXPECT_THAT(r->generations(2).lost_nodes(), ElementsAre("n3", "n2"));
}

// Prometheus goes on with the same run: the ranks the shrunk world does not have lose their series
// (a dashboard would otherwise show their last values as live), the others keep theirs.
TEST_F(ElasticTest, PrometheusDropsTheSeriesOfRanksTheShrunkWorldDoesNotHave) {
  ExporterOptions options;
  options.listen = "127.0.0.1:0";
  auto exporter = PrometheusExporter::Start(options, coord_.get());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  std::string run = SubmitElastic(3, 2);
  auto ranks = RegisterAll(run, 3, 2);
  auto report = [&](int rank, double loss) {
    absl::StatusOr<v1::Run> r = coord_->GetRun(run);
    ASSERT_TRUE(r.ok());
    v1::MetricBatch batch;
    batch.set_run_id(run);
    batch.set_rank(rank);
    batch.set_generation(r->generation());
    v1::MetricPoint* p = batch.add_points();
    p->set_step(1);
    (*p->mutable_values())["loss"] = loss;
    (*exporter)->OnMetrics(*r, batch);
  };
  auto scrape = [&] {
    testing::HttpResponse got = testing::Http("GET", absl::StrCat("http://", (*exporter)->address(), "/metrics"));
    EXPECT_EQ(got.status, 200) << got.error;
    return got.body;
  };
  auto loss_series = [&](int rank, const std::string& node) {
    return absl::StrCat("dt_train_loss{experiment=\"elastic\",node=\"", node, "\",rank=\"", rank, "\",run=\"", run,
                        "\"}");
  };
  for (int rank = 0; rank < 6; ++rank) report(rank, 2.0);
  EXPECT_THAT(scrape(), HasSubstr(loss_series(5, "n3")));
  OnlyTheseBeat(run, {ranks[0], ranks[1], ranks[2], ranks[3]});
  RegisterAll(run, 2, 2);
  (*exporter)->OnRunChanged(*coord_->GetRun(run));
  std::string body = scrape();
  EXPECT_THAT(body, HasSubstr(absl::StrCat(loss_series(3, "n2"), " 2\n")));
  EXPECT_THAT(body, Not(HasSubstr(loss_series(4, "n3"))));
  EXPECT_THAT(body, Not(HasSubstr(loss_series(5, "n3"))));
  report(5, 9.0);  // a late point of the lost node's rank makes no series again
  EXPECT_THAT(scrape(), Not(HasSubstr(loss_series(5, "n3"))));
}

TEST_F(ElasticTest, SubmitRefusesAMinNodesOutOfRangeOrForAnotherLauncher) {
  v1::RunSpec spec = testing::MakeSpec("bad", save_dir_, 3, 2, 1);
  spec.set_scheduler(v1::LOCAL);
  for (int min_nodes : {-1, 3, 4}) {
    spec.set_min_nodes(min_nodes);
    auto r = coord_->SubmitRun(spec);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << min_nodes;
    EXPECT_THAT(r.status().message(), HasSubstr("min nodes must be within 1..2")) << r.status();
  }
  spec.set_min_nodes(2);
  spec.set_scheduler(v1::EXTERNAL);
  auto r = coord_->SubmitRun(spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("runs dtctl launches (local or Slurm)"));
  spec.set_scheduler(v1::SLURM);
  EXPECT_TRUE(coord_->SubmitRun(spec).ok());
}

}  // namespace
}  // namespace dt
