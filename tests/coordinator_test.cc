// The coordinator's logic without a network, on a fake clock: runs, rendezvous, generations and
// restarts, failure detection, barriers, checkpoint rounds, persistence.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/run_env.h"
#include "common/utf8.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/checkpoint_publisher.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_monitor.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/prometheus_exporter.h"
#include "coordinator/rank_registration.h"
#include "coordinator/stack_captures.h"
#include "coordinator/store_barriers.h"
#include "tests/http_test_client.h"
#include "tests/test_util.h"

#include "tests/coordinator_fixture.h"

namespace dt {
namespace {

namespace fs = std::filesystem;
using testing::CoordinatorTest;
using testing::Reply;

TEST_F(CoordinatorTest, SubmitCreatesTheExperimentDirectoryOnce) {
  auto r = coord_->SubmitRun(testing::MakeSpec("gpt2-alpaca", save_dir_, 1, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exp_dir(), save_dir_ + "/gpt2-alpaca");
  EXPECT_TRUE(fs::is_directory(r->exp_dir() + "/logs"));
  EXPECT_TRUE(fs::is_directory(r->exp_dir() + "/checkpoints"));
  EXPECT_NE(testing::Slurp(r->exp_dir() + "/run.json").find(r->run_id()), std::string::npos);
  EXPECT_EQ(r->resume_step(), 0);
  EXPECT_EQ(State(r->run_id()), v1::PENDING);
  // A second active run on the same directory is refused and told which run holds it.
  auto again = coord_->SubmitRun(testing::MakeSpec("gpt2-alpaca", save_dir_, 1, 2));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find(r->run_id()), std::string::npos);
  // Tokens: the run's token maps to it; it is stored only as a digest.
  EXPECT_EQ(coord_->RunForTokenDigest(Sha256Hex(r->run_token())), r->run_id());
}

TEST_F(CoordinatorTest, SubmitValidatesTheSpec) {
  auto bad = [&](v1::RunSpec spec, absl::StatusCode code, const char* words) {
    auto r = coord_->SubmitRun(spec);
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
  };
  bad(testing::MakeSpec("a/b", save_dir_, 1, 1), absl::StatusCode::kInvalidArgument, "'/'");
  bad(testing::MakeSpec("ok", "relative", 1, 1), absl::StatusCode::kInvalidArgument, "absolute");
  bad(testing::MakeSpec("ok", save_dir_, 0, 1), absl::StatusCode::kInvalidArgument, "nodes");
  bad(testing::MakeSpec("ok", save_dir_, 400, 400), absl::StatusCode::kResourceExhausted, "131072");
  auto spec = testing::MakeSpec("ok", save_dir_, 1, 1);
  spec.mutable_wandb()->set_mode("sometimes");
  bad(spec, absl::StatusCode::kInvalidArgument, "W&B mode");
  bad(testing::MakeSpec("ok", "/proc/forbidden", 1, 1), absl::StatusCode::kFailedPrecondition, "/proc");
  // The coordinator's W&B key goes where its operator points it, never where a run says.
  spec = testing::MakeSpec("ok", save_dir_, 1, 1);
  spec.mutable_wandb()->set_base_url("http://collector.example:8080");
  bad(spec, absl::StatusCode::kInvalidArgument, "WANDB_BASE_URL");
  // --idle-timeout and --max-identical-hangs are checked too.
  spec = testing::MakeSpec("ok", save_dir_, 1, 1);
  spec.set_max_identical_hangs(0);
  bad(spec, absl::StatusCode::kInvalidArgument, "max identical hangs");
  // A run's variables: never one dt sets for the ranks (they would disagree with dt about who
  // they are), and bounded; its own are kept with the run.
  spec = testing::MakeSpec("env", save_dir_, 1, 1);
  (*spec.mutable_env())["WORLD_SIZE"] = "3";
  bad(spec, absl::StatusCode::kInvalidArgument, "environment variable WORLD_SIZE cannot be set");
  spec.clear_env();
  (*spec.mutable_env())["HF_HOME"] = std::string(kMaxRunEnvValueBytes + 1, 'x');
  bad(spec, absl::StatusCode::kInvalidArgument, "HF_HOME's value is");
  spec.clear_env();
  (*spec.mutable_env())["HF_HOME"] = "/data/hf";
  auto kept = coord_->SubmitRun(spec);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(coord_->GetRun(kept->run_id())->spec().env().at("HF_HOME"), "/data/hf");
}

// Labels are bounded (a tester's 3,600 labels of 4,000 B made every ListRuns answer outgrow a gRPC
// message), and ListRuns pages: each page fits a message; the pages together list every run once.
TEST_F(CoordinatorTest, LabelsAreBoundedAndListRunsPagesFitAMessage) {
  v1::RunSpec spec = testing::MakeSpec("labelled", save_dir_, 1, 1);
  for (int k = 0; k <= kMaxLabels; ++k) (*spec.mutable_labels())[absl::StrCat("k", k)] = "v";
  auto refused = coord_->SubmitRun(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("at most 64 labels"), std::string::npos) << refused.status();
  spec.clear_labels();
  (*spec.mutable_labels())["big"] = std::string(kMaxLabelValueBytes + 1, 'x');
  EXPECT_EQ(coord_->SubmitRun(spec).status().code(), absl::StatusCode::kInvalidArgument);
  // Runs as large as labels allow: 64 × 1 KiB each, ~65 KB a run; 150 of them are ~10 MB.
  spec.clear_labels();
  for (int k = 0; k < kMaxLabels; ++k) (*spec.mutable_labels())[absl::StrCat("k", k)] = std::string(1000, 'v');
  std::set<std::string> submitted;
  for (int n = 0; n < 150; ++n) {
    spec.set_experiment_name(absl::StrCat("big-", n));
    auto r = coord_->SubmitRun(spec);
    ASSERT_TRUE(r.ok()) << r.status();
    submitted.insert(r->run_id());
    clock_.Advance(absl::Milliseconds(1));
  }
  std::set<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    auto page = coord_->ListRuns(0, {}, token);
    ASSERT_TRUE(page.ok()) << page.status();
    size_t bytes = 0;
    for (const v1::Run& r : page->runs) {
      bytes += r.ByteSizeLong();
      EXPECT_TRUE(listed.insert(r.run_id()).second) << "listed twice: " << r.run_id();
    }
    EXPECT_LE(bytes, kMaxListRunsPageBytes);
    token = page->next_page_token;
    ++pages;
  } while (!token.empty() && pages < 100);
  EXPECT_GE(pages, 3);
  EXPECT_EQ(listed, submitted);
  // A limit pages too; a token that is not one is refused, naming it.
  auto first = coord_->ListRuns(10, {});
  ASSERT_EQ(first->runs.size(), 10u);
  auto second = coord_->ListRuns(10, {}, first->next_page_token);
  ASSERT_EQ(second->runs.size(), 10u);
  EXPECT_NE(first->runs.back().run_id(), second->runs.front().run_id());
  EXPECT_EQ(coord_->ListRuns(0, {}, "nonsense").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, JoinKeyMakesSubmitCreateOrJoin) {
  auto spec = testing::MakeSpec("byo", save_dir_, 2, 1);
  spec.set_scheduler(v1::EXTERNAL);
  spec.set_join_key("byo@slurm-77");
  auto first = coord_->SubmitRun(spec);
  auto second = coord_->SubmitRun(spec);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->run_id(), second->run_id());
  EXPECT_FALSE(first->joined());
  EXPECT_TRUE(second->joined());
}

TEST_F(CoordinatorTest, RendezvousWaitsForEveryRankThenAssignsNodeContiguousRanks) {
  std::string run = Submit(2, 2);
  Reply<v1::RegisterResponse> a, b, c, d;
  coord_->registration().Register(RegisterRequest(run, "n2", 1), a.pending());
  coord_->registration().Register(RegisterRequest(run, "n1", 0), b.pending());
  coord_->registration().Register(RegisterRequest(run, "n2", 0), c.pending());
  EXPECT_FALSE(a.arrived() || b.arrived() || c.arrived());
  EXPECT_EQ(State(run), v1::RENDEZVOUS);
  coord_->registration().Register(RegisterRequest(run, "n1", 1), d.pending());
  ASSERT_TRUE(a.arrived() && b.arrived() && c.arrived() && d.arrived());
  EXPECT_EQ(a.value->rank(), 3);
  EXPECT_EQ(b.value->rank(), 0);
  EXPECT_EQ(c.value->rank(), 2);
  EXPECT_EQ(d.value->rank(), 1);
  EXPECT_EQ(c.value->node_rank(), 1);
  EXPECT_EQ(c.value->local_rank(), 0);
  EXPECT_EQ(a.value->world_size(), 4);
  EXPECT_EQ(a.value->local_world_size(), 2);
  EXPECT_EQ(a.value->generation(), 0);
  EXPECT_GT(a.value->timeouts().collective_timeout_ms(), 0);
  EXPECT_EQ(State(run), v1::RUNNING);
  auto status = coord_->GetRun(run);
  ASSERT_EQ(status->ranks_size(), 4);
  EXPECT_EQ(status->ranks(2).node(), "n2");
  // run.json is rewritten off the run's lock, on the file-work queue.
  EXPECT_TRUE(testing::WaitFor(
      [&] { return testing::Slurp(status->exp_dir() + "/run.json").find("host-n2") != std::string::npos; },
      absl::Seconds(10)));
}

TEST_F(CoordinatorTest, WorldViewMismatchIsRefusedInsteadOfFormingASmallerWorld) {
  std::string run = Submit(2, 2);
  v1::RegisterRequest req = RegisterRequest(run, "n1", 0);
  req.mutable_expected()->set_world_size(1);
  req.mutable_expected()->set_nodes(1);
  req.mutable_expected()->set_procs_per_node(1);
  Reply<v1::RegisterResponse> r;
  coord_->registration().Register(req, r.pending());
  EXPECT_EQ(r.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.value.status().message().find("world size 4"), std::string::npos) << r.value.status();
  // A slot beyond procs per node, and a third node in a two-node run.
  Reply<v1::RegisterResponse> slot;
  coord_->registration().Register(RegisterRequest(run, "n1", 2), slot.pending());
  EXPECT_EQ(slot.value.status().code(), absl::StatusCode::kFailedPrecondition);
  Reply<v1::RegisterResponse> x, y, z;
  coord_->registration().Register(RegisterRequest(run, "a", 0), x.pending());
  coord_->registration().Register(RegisterRequest(run, "b", 0), y.pending());
  coord_->registration().Register(RegisterRequest(run, "c", 0), z.pending());
  EXPECT_EQ(z.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(z.value.status().message().find("node 3 of a 2-node run"), std::string::npos);
}

// --nproc-per-node gpu|cpu|auto on Slurm: each node's dtrun counts its processes; the first node
// to register fixes the run's count and world size, and the run forms at that shape.
TEST_F(CoordinatorTest, TheFirstNodesCountFixesACountedRunsShape) {
  v1::RunSpec spec = testing::MakeSpec("counted", save_dir_, 2, 0);
  spec.set_procs_per_node_rule("gpu");
  spec.add_exec_command("/bin/true");
  absl::StatusOr<v1::SubmitRunResponse> submitted = coord_->SubmitRun(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::string run = submitted->run_id();
  EXPECT_EQ(coord_->GetRun(run)->world_size(), 0);
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> replies;
  for (const std::string node : {"n2", "n1"}) {
    for (int slot = 0; slot < 3; ++slot) {
      v1::RegisterRequest req = RegisterRequest(run, node, slot);
      req.mutable_expected()->set_procs_per_node(3);
      replies.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
      coord_->registration().Register(req, replies.back()->pending());
    }
  }
  for (const auto& reply : replies) {
    ASSERT_TRUE(reply->arrived());
    ASSERT_TRUE(reply->value.ok()) << reply->value.status();
    EXPECT_EQ(reply->value->world_size(), 6);
    EXPECT_EQ(reply->value->local_world_size(), 3);
  }
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  EXPECT_EQ(r->state(), v1::RUNNING);
  EXPECT_EQ(r->world_size(), 6);
  EXPECT_EQ(r->spec().procs_per_node(), 3);
  EXPECT_EQ(r->spec().procs_per_node_rule(), "gpu");
  EXPECT_EQ(r->procs_per_node_counted_on(), "n2");
  // The count is part of the run's record: a restarted coordinator knows it.
  Reopen();
  EXPECT_EQ(coord_->GetRun(run)->spec().procs_per_node(), 3);
  EXPECT_EQ(coord_->GetRun(run)->procs_per_node_counted_on(), "n2");
}

// A --nproc-per-node gpu run holds one rank per node of --max-ranks until its first node counts;
// a count that would pass the limit ends the run (RESOURCE_EXHAUSTED naming it), and the run's
// ranks are given back.
TEST_F(CoordinatorTest, ACountThatWouldPassMaxRanksEndsTheRunAndGivesItsRanksBack) {
  max_ranks_ = 5;
  Reopen();
  v1::RunSpec spec = testing::MakeSpec("counted", save_dir_, 2, 0);
  spec.set_procs_per_node_rule("gpu");
  spec.add_exec_command("/bin/true");
  std::string run = coord_->SubmitRun(spec)->run_id();
  Submit(1, 1, 0, "other");  // 2 + 1 of 5 held
  absl::StatusOr<v1::SubmitRunResponse> too_big = coord_->SubmitRun(testing::MakeSpec("too-big", save_dir_, 1, 3));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  Reply<v1::RegisterResponse> counted;
  v1::RegisterRequest req = RegisterRequest(run, "n1", 0);
  req.mutable_expected()->set_procs_per_node(3);  // 6 ranks: 4 more than held, 2 free
  coord_->registration().Register(req, counted.pending());
  ASSERT_TRUE(counted.arrived());
  EXPECT_EQ(counted.value.status().code(), absl::StatusCode::kResourceExhausted) << counted.value.status();
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  EXPECT_EQ(r->state(), v1::FAILED);
  EXPECT_EQ(r->reason().kind(), v1::Failure::MISCONFIGURED);
  EXPECT_THAT(r->reason().message(), ::testing::HasSubstr("at most 5 ranks at once (dtcoord --max-ranks)"));
  EXPECT_THAT(r->reason().message(), ::testing::HasSubstr("asks for 4"));
  // The failed run's two ranks are free again: 1 + 4 fit in 5.
  absl::StatusOr<v1::SubmitRunResponse> fits = coord_->SubmitRun(testing::MakeSpec("fits", save_dir_, 1, 4));
  EXPECT_TRUE(fits.ok()) << fits.status();
}

// What each run holds of --max-ranks, through its life: its world from submission; a counted
// run one rank per node, then its whole world once counted; a join nothing; a submission that
// cannot make its directory nothing once refused; a restarted coordinator what it loaded; an
// ended run nothing.
TEST_F(CoordinatorTest, AdmittedRanksFollowEveryRunFromSubmissionToItsEnd) {
  auto admitted = [this] { return coord_->TakeCensus().admitted_ranks; };
  std::string plain = Submit(2, 3, 0, "plain");
  EXPECT_EQ(admitted(), 6);
  v1::RunSpec counted_spec = testing::MakeSpec("counted", save_dir_, 2, 0);
  counted_spec.set_procs_per_node_rule("gpu");
  counted_spec.add_exec_command("/bin/true");
  std::string counted = coord_->SubmitRun(counted_spec)->run_id();
  EXPECT_EQ(admitted(), 8);
  Reply<v1::RegisterResponse> first;
  v1::RegisterRequest req = RegisterRequest(counted, "n1", 0);
  req.mutable_expected()->set_procs_per_node(4);
  coord_->registration().Register(req, first.pending());
  EXPECT_EQ(admitted(), 14);  // 2 nodes x 4
  v1::RunSpec joined = testing::MakeSpec("byo", save_dir_, 1, 2);
  joined.set_scheduler(v1::EXTERNAL);
  joined.set_join_key("byo@slurm-9");
  ASSERT_TRUE(coord_->SubmitRun(joined).ok());
  ASSERT_TRUE(coord_->SubmitRun(joined)->joined());
  EXPECT_EQ(admitted(), 16);  // the join took nothing
  std::string file = JoinPath(save_dir_, "a-file");
  ASSERT_TRUE(WriteFileAtomic(file, "x").ok());
  EXPECT_FALSE(coord_->SubmitRun(testing::MakeSpec("x", JoinPath(file, "below"), 1, 1)).ok());
  EXPECT_EQ(admitted(), 16);
  Reopen();
  EXPECT_EQ(admitted(), 16);
  ASSERT_TRUE(coord_->CancelRun(counted, "done").ok());
  EXPECT_EQ(admitted(), 8);
  ASSERT_TRUE(coord_->CancelRun(plain, "done").ok());
  ASSERT_TRUE(coord_->CancelRun(plain, "again").ok());  // an ended run gives nothing twice
  EXPECT_EQ(admitted(), 2);
}

// A node that counted another number than the first node ends the run at once, naming both: a
// restart would count the same again, and a smaller world would train something else.
TEST_F(CoordinatorTest, ANodeThatCountsDifferentlyEndsTheRunNamingBothCounts) {
  v1::RunSpec spec = testing::MakeSpec("uneven", save_dir_, 2, 0, /*max_restarts=*/3);
  spec.set_procs_per_node_rule("cpu");
  spec.add_exec_command("/bin/true");
  std::string run = coord_->SubmitRun(spec)->run_id();
  Reply<v1::RegisterResponse> first, second;
  v1::RegisterRequest a = RegisterRequest(run, "big", 0);
  a.mutable_expected()->set_procs_per_node(2);
  coord_->registration().Register(a, first.pending());
  EXPECT_FALSE(first.arrived());
  v1::RegisterRequest b = RegisterRequest(run, "small", 0);
  b.mutable_expected()->set_procs_per_node(1);
  coord_->registration().Register(b, second.pending());
  ASSERT_TRUE(second.arrived() && first.arrived());
  EXPECT_EQ(second.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(first.value.ok());
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  EXPECT_EQ(r->state(), v1::FAILED);
  EXPECT_EQ(r->restarts(), 0);  // not restarted: the nodes would count the same again
  EXPECT_EQ(r->reason().kind(), v1::Failure::MISCONFIGURED);
  EXPECT_TRUE(r->reason().fatal());
  EXPECT_EQ(r->reason().node(), "small");
  for (const char* part : {"node \"small\" counted 1 processes (--nproc-per-node cpu)", "node \"big\" counted 2"}) {
    EXPECT_NE(r->reason().message().find(part), std::string::npos) << r->reason().message();
    EXPECT_NE(second.value.status().message().find(part), std::string::npos) << second.value.status();
  }
}

// What a counted run's spec may say, and a registrant that does not count.
TEST_F(CoordinatorTest, ACountedRunNeedsDtrunAndAKnownRule) {
  v1::RunSpec trainer = testing::MakeSpec("t", save_dir_, 1, 0);
  trainer.set_procs_per_node_rule("gpu");
  absl::StatusOr<v1::SubmitRunResponse> refused = coord_->SubmitRun(trainer);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("only by dtrun"), std::string::npos) << refused.status();
  v1::RunSpec unknown = testing::MakeSpec("u", save_dir_, 1, 2);
  unknown.set_procs_per_node_rule("tpu");
  refused = coord_->SubmitRun(unknown);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("\"tpu\" is not one of gpu, cpu or auto"), std::string::npos)
      << refused.status();
  // A count resolved by the submitter (a local run) keeps its rule for display.
  v1::RunSpec local = testing::MakeSpec("l", save_dir_, 1, 2);
  local.set_procs_per_node_rule("auto");
  EXPECT_TRUE(coord_->SubmitRun(local).ok());
  v1::RunSpec counted = testing::MakeSpec("c", save_dir_, 1, 0);
  counted.set_procs_per_node_rule("auto");
  counted.add_exec_command("/bin/true");
  std::string run = coord_->SubmitRun(counted)->run_id();
  Reply<v1::RegisterResponse> silent;
  coord_->registration().Register(RegisterRequest(run, "n1", 0), silent.pending());
  EXPECT_EQ(silent.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(silent.value.status().message().find("did not say its node's count"), std::string::npos)
      << silent.value.status();
  EXPECT_EQ(State(run), v1::PENDING);
}

TEST_F(CoordinatorTest, RendezvousTimeoutNamesWhoCameAndWhoDidNot) {
  std::string run = Submit(2, 2);
  Reply<v1::RegisterResponse> a, b;
  coord_->registration().Register(RegisterRequest(run, "n1", 0), a.pending());
  coord_->registration().Register(RegisterRequest(run, "n1", 1), b.pending());
  Advance(absl::Minutes(5) + absl::Seconds(1));
  ASSERT_TRUE(a.arrived());
  EXPECT_EQ(a.value.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string msg(a.value.status().message());
  EXPECT_NE(msg.find("2 of 4 registered"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n1/0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 node never seen"), std::string::npos) << msg;
  EXPECT_EQ(State(run), v1::FAILED);
  EXPECT_EQ(coord_->GetRun(run)->reason().kind(), v1::Failure::RENDEZVOUS_TIMEOUT);
}

TEST_F(CoordinatorTest, RetryWithTheSameIncarnationGetsTheSameAssignment) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2);
  Reply<v1::RegisterResponse> again;
  coord_->registration().Register(RegisterRequest(run, "n1", 1), again.pending());
  ASSERT_TRUE(again.value.ok());
  EXPECT_EQ(again.value->rank(), 1);
  EXPECT_EQ(State(run), v1::RUNNING);
}

TEST_F(CoordinatorTest, SilentRankFailsTheGenerationAndEveryOpenBarrierAtOnce) {
  std::string run = Submit(1, 3, /*max_restarts=*/1);
  auto ranks = RegisterAll(run, 1, 3);
  Reply<v1::BarrierResponse> b0, b1;
  v1::BarrierRequest req = BarrierRequest(run, "data-ready", 3'600'000);
  req.set_rank(0);
  coord_->store_barriers().Barrier(req, b0.pending());
  req.set_rank(1);
  coord_->store_barriers().Barrier(req, b1.pending());
  // Ranks 0 and 1 heartbeat; rank 2 went silent.
  for (int i = 0; i < 16; ++i) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run, ranks[0], 0).ok());
    ASSERT_TRUE(Beat(run, ranks[1], 0).ok());
  }
  ASSERT_TRUE(b0.arrived());
  EXPECT_EQ(b0.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(b0.value.status().message().find("rank 2"), std::string::npos) << b0.value.status();
  EXPECT_NE(b0.value.status().message().find("no heartbeat"), std::string::npos);
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->state(), v1::RESTARTING);
  EXPECT_EQ(status->restarts(), 1);
  EXPECT_EQ(status->generation(), 1);
  EXPECT_EQ(status->reason().kind(), v1::Failure::HEARTBEAT_TIMEOUT);
  EXPECT_EQ(status->reason().rank(), 2);
  // When the silent rank was last heard from: before the verdict, by at least the timeout.
  ASSERT_TRUE(status->reason().has_last_heard());
  EXPECT_LE(status->reason().last_heard().seconds() + 3, status->reason().time().seconds());
  // The survivors of generation 0 are told to stop, with the cause.
  auto hb = Beat(run, ranks[0], 0);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->directive(), v1::HeartbeatResponse::STOP);
  EXPECT_NE(hb->reason().find("rank 2"), std::string::npos) << hb->reason();
  // Old-generation calls are ABORTED.
  EXPECT_EQ(coord_->store_barriers()
                .OpenStore([&] {
                  v1::StoreScope s;
                  s.set_run_id(run);
                  s.set_generation(0);
                  s.set_rank(0);
                  return s;
                }())
                .status()
                .code(),
            absl::StatusCode::kAborted);
  // Generation 1 forms from relaunched processes.
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> again;
  for (int s = 0; s < 3; ++s) {
    again.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
    coord_->registration().Register(RegisterRequest(run, "n1", s, "new-" + std::to_string(s)), again.back()->pending());
  }
  ASSERT_TRUE(again[2]->value.ok());
  EXPECT_EQ(again[2]->value->generation(), 1);
  EXPECT_EQ(again[2]->value->restarts(), 1);
  EXPECT_EQ(State(run), v1::RUNNING);
}

TEST_F(CoordinatorTest, DtBarrierNamesAreReservedExceptDataReady) {
  std::string run = Submit(1, 1);
  RegisterAll(run, 1, 1);
  v1::BarrierRequest req;
  req.set_run_id(run);
  req.set_generation(0);
  req.set_rank(0);
  req.set_timeout_ms(60'000);
  req.set_name("dt.checkpoint/100");
  Reply<v1::BarrierResponse> reserved;
  coord_->store_barriers().Barrier(req, reserved.pending());
  ASSERT_TRUE(reserved.arrived());
  EXPECT_EQ(reserved.value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reserved.value.status().message().find("reserved"), std::string::npos) << reserved.value.status();
  // The trainer's own data barrier and user names pass (a world of one releases at once).
  for (const char* name : {"dt.data-ready", "my-dt.sync"}) {
    req.set_name(name);
    Reply<v1::BarrierResponse> ok;
    coord_->store_barriers().Barrier(req, ok.pending());
    ASSERT_TRUE(ok.arrived()) << name;
    EXPECT_TRUE(ok.value.ok()) << name << ": " << ok.value.status();
  }
}

TEST_F(CoordinatorTest, EveryAnnouncedChangeHasAHigherRevision) {
  std::string run = Submit(1, 2);
  uint64_t submitted = coord_->GetRun(run)->revision();
  RegisterAll(run, 1, 2);
  uint64_t running = coord_->GetRun(run)->revision();
  EXPECT_EQ(State(run), v1::RUNNING);
  EXPECT_GT(running, submitted);
  ASSERT_TRUE(coord_->CancelRun(run, "test").ok());
  EXPECT_GT(coord_->GetRun(run)->revision(), running);
}

TEST_F(CoordinatorTest, ReportedErrorIsTheRootCauseWhenTheBudgetIsSpent) {
  std::string run = Submit(1, 2, /*max_restarts=*/0);
  auto ranks = RegisterAll(run, 1, 2);
  v1::ReportErrorRequest err;
  err.set_run_id(run);
  err.set_generation(0);
  err.set_rank(1);
  err.set_message("CUDA out of memory");
  err.set_exception_type("c10::Error");
  err.set_step(17);
  auto r = coord_->health().ReportError(err);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->run_state(), v1::FAILED);
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->reason().rank(), 1);
  EXPECT_EQ(status->reason().host(), "host-n1");
  EXPECT_EQ(status->reason().step(), 17);
  EXPECT_EQ(status->reason().message(), "CUDA out of memory");
  EXPECT_TRUE(status->has_ended_at());
  // A second failure does not replace the root cause.
  err.set_rank(0);
  err.set_message("gloo timeout");
  ASSERT_TRUE(coord_->health().ReportError(err).ok());
  EXPECT_EQ(coord_->GetRun(run)->reason().message(), "CUDA out of memory");
  // Registering into an ended run is refused with the cause.
  Reply<v1::RegisterResponse> late;
  coord_->registration().Register(RegisterRequest(run, "n1", 0, "late"), late.pending());
  EXPECT_EQ(late.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(late.value.status().message().find("CUDA out of memory"), std::string::npos);
}

v1::ReportStoppedRequest StopReport(const std::string& run, const v1::RegisterResponse& a, int signal, int64_t step) {
  v1::ReportStoppedRequest req;
  req.set_run_id(run);
  req.set_generation(a.generation());
  req.set_rank(a.rank());
  req.set_incarnation("n" + std::to_string(a.node_rank() + 1) + "-" + std::to_string(a.local_rank()));
  req.set_signal(signal);
  req.set_step(step);
  return req;
}

// srun kills the dead task's peers with SIGTERM a moment after the task died: the rank that went
// quiet first may be a victim. Its report makes the dead rank the one named, however long the
// victim was silent.
TEST_F(CoordinatorTest, AStoppedRankIsListedAsAVictimAndTheSilentRankIsTheCause) {
  std::string run = Submit(1, 2, /*max_restarts=*/0);
  auto ranks = RegisterAll(run, 1, 2);
  ASSERT_TRUE(Beat(run, ranks[0], 4).ok());
  ASSERT_TRUE(Beat(run, ranks[1], 4).ok());
  auto stopped = coord_->health().ReportStopped(StopReport(run, ranks[0], 15, 4));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->run_state(), v1::RUNNING);
  EXPECT_EQ(coord_->GetRun(run)->ranks(0).state(), v1::RankStatus::STOPPED);
  Advance(absl::Seconds(1));
  ASSERT_TRUE(Beat(run, ranks[1], 4).ok());  // rank 1 dies after this one
  Advance(absl::Seconds(30));
  EXPECT_EQ(State(run), v1::RUNNING);  // rank 0, silent for 31 s, is not the cause
  Advance(absl::Seconds(2));
  auto status = coord_->GetRun(run);
  ASSERT_EQ(status->state(), v1::FAILED);
  EXPECT_EQ(status->reason().kind(), v1::Failure::HEARTBEAT_TIMEOUT);
  EXPECT_EQ(status->reason().rank(), 1);
  EXPECT_THAT(status->reason().stopped_ranks(), ::testing::ElementsAre(0));
  EXPECT_NE(status->reason().message().find("victims, not causes): rank 0"), std::string::npos)
      << status->reason().message();
  EXPECT_NE(status->reason().message().find("SIGTERM"), std::string::npos);
  EXPECT_EQ(status->ranks(0).state(), v1::RankStatus::STOPPED);
  EXPECT_EQ(status->ranks(1).state(), v1::RankStatus::FAILED);
  // A stop reported after the generation ended changes nothing.
  auto late = coord_->health().ReportStopped(StopReport(run, ranks[1], 15, 4));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->run_state(), v1::FAILED);
  EXPECT_EQ(coord_->GetRun(run)->reason().rank(), 1);
}

TEST_F(CoordinatorTest, AStopNothingElseExplainsEndsTheGenerationAsTerminated) {
  std::string run = Submit(1, 2, /*max_restarts=*/1);
  auto ranks = RegisterAll(run, 1, 2);
  ASSERT_TRUE(coord_->health().ReportStopped(StopReport(run, ranks[1], 2, 0)).ok());
  for (int i = 0; i < 15; ++i) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run, ranks[0], 0).ok());
  }
  EXPECT_EQ(State(run), v1::RUNNING);
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(run, ranks[0], 0).ok());
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->state(), v1::RESTARTING);  // restarted within the budget
  EXPECT_EQ(status->reason().kind(), v1::Failure::TERMINATED);
  EXPECT_EQ(status->reason().rank(), 1);
  EXPECT_NE(status->reason().message().find("SIGINT"), std::string::npos) << status->reason().message();
}

TEST_F(CoordinatorTest, ReportStoppedValidatesItsFields) {
  std::string run = Submit(1, 2);
  Reply<v1::RegisterResponse> first;
  coord_->registration().Register(RegisterRequest(run, "n1", 0), first.pending());
  v1::RegisterResponse fake;  // rank 0 of generation 0, before the rendezvous completed
  EXPECT_EQ(coord_->health().ReportStopped(StopReport(run, fake, 15, 0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto ranks = RegisterAll(run, 1, 2);
  EXPECT_EQ(coord_->health().ReportStopped(StopReport(run, ranks[0], 0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coord_->health().ReportStopped(StopReport(run, ranks[0], 15, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coord_->health().ReportStopped(StopReport("r-00000000000000ff", ranks[0], 15, 0)).status().code(),
            absl::StatusCode::kNotFound);
  v1::ReportStoppedRequest other = StopReport(run, ranks[0], 15, 0);
  other.set_incarnation("someone-else");
  auto replaced = coord_->health().ReportStopped(other);
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(replaced.status().message().find("replaced"), std::string::npos) << replaced.status();
  other = StopReport(run, ranks[0], 15, 0);
  other.set_rank(2);
  EXPECT_FALSE(coord_->health().ReportStopped(other).ok());
  EXPECT_EQ(coord_->GetRun(run)->ranks(0).state(), v1::RankStatus::ACTIVE);
}

// Under srun each rank registers its SLURM_PROCID; srun's "task N: Killed" names the rank even
// when the task's peers were stopped first.
TEST_F(CoordinatorTest, ALaunchersReportByTaskNamesTheRankThatHeldIt) {
  std::string run = Submit(2, 1, /*max_restarts=*/0);
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> replies;
  for (int task : {1, 0}) {  // task 1 runs on n2, task 0 on n1
    v1::RegisterRequest req = RegisterRequest(run, "n" + std::to_string(task + 1), 0);
    req.set_scheduler_task(task);
    replies.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
    coord_->registration().Register(req, replies.back()->pending());
  }
  ASSERT_TRUE(replies[0]->value.ok()) << replies[0]->value.status();
  ASSERT_TRUE(replies[1]->value.ok());
  int rank_of_task1 = replies[0]->value->rank();
  EXPECT_EQ(coord_->GetRun(run)->ranks(rank_of_task1).scheduler_task(), 1);
  ASSERT_TRUE(coord_->health().ReportStopped(StopReport(run, *replies[1]->value, 15, 3)).ok());
  v1::ReportErrorRequest err;
  err.set_run_id(run);
  err.set_generation(0);
  err.set_rank(-1);
  err.set_local_slot(-1);
  err.set_scheduler_task(1);
  err.set_process_exited(true);
  err.set_message("srun: error: n2: task 1: Killed");
  // Validation first: a task outside the world, a rank and a task together.
  v1::ReportErrorRequest bad = err;
  bad.set_scheduler_task(2);
  EXPECT_EQ(coord_->health().ReportError(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = err;
  bad.set_rank(0);
  EXPECT_EQ(coord_->health().ReportError(bad).status().code(), absl::StatusCode::kInvalidArgument);
  auto r = coord_->health().ReportError(err);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->run_state(), v1::FAILED);
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->reason().kind(), v1::Failure::PROCESS_EXITED);
  EXPECT_EQ(status->reason().rank(), rank_of_task1);
  EXPECT_EQ(status->reason().node(), "n2");
  EXPECT_THAT(status->reason().stopped_ranks(), ::testing::ElementsAre(1 - rank_of_task1));
}

TEST_F(CoordinatorTest, AReportByATaskThatHoldsNoRankIsRefused) {
  std::string run = Submit(1, 2, /*max_restarts=*/0);
  RegisterAll(run, 1, 2);  // registered without task ids (not under srun)
  v1::ReportErrorRequest err;
  err.set_run_id(run);
  err.set_rank(-1);
  err.set_local_slot(-1);
  err.set_scheduler_task(0);
  err.set_message("srun: error: n1: task 0: Killed");
  auto r = coord_->health().ReportError(err);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("holds no rank"), std::string::npos) << r.status();
  EXPECT_EQ(State(run), v1::RUNNING);
}

// A long message cut at 64 KiB must not split a character: a stored string that is not UTF-8
// makes every reply that carries the run unparseable ("No message returned" in dtctl list).
TEST_F(CoordinatorTest, ALongReportedErrorIsCutAtACharacterBoundary) {
  std::string run = Submit(1, 1, /*max_restarts=*/0);
  RegisterAll(run, 1, 1);
  v1::ReportErrorRequest err;
  err.set_run_id(run);
  err.set_rank(0);
  err.set_message("x");
  for (int i = 0; i < 40000; ++i) err.mutable_message()->append("\xC3\xA9");  // é: the cut lands mid-character
  err.set_stack(err.message());
  ASSERT_TRUE(coord_->health().ReportError(err).ok());
  auto status = coord_->GetRun(run);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(IsValidUtf8(status->reason().message()));
  EXPECT_TRUE(IsValidUtf8(status->reason().stack()));
  EXPECT_NE(status->reason().message().find("truncated from 80001 bytes"), std::string::npos);
  v1::Run parsed;
  EXPECT_TRUE(parsed.ParseFromString(status->SerializeAsString()));
  Reopen();  // and from the database after a restart
  ASSERT_TRUE(parsed.ParseFromString(coord_->GetRun(run)->SerializeAsString()));
  EXPECT_EQ(parsed.reason().message(), status->reason().message());
}

// The 2 s progress flush writes its snapshot from the file work, off the run's lock: what the
// ranks reported is in the database for a restarted coordinator (no state change wrote it).
TEST_F(CoordinatorTest, ThePeriodicFlushSavesTheRanksProgress) {
  std::string run = Submit(1, 2);
  auto a = RegisterAll(run, 1, 2);
  ASSERT_TRUE(Beat(run, a[0], 5).ok());
  ASSERT_TRUE(Beat(run, a[1], 7).ok());
  Advance(absl::Seconds(3));
  coord_->AwaitFileWork();
  Reopen();
  auto status = coord_->GetRun(run);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->ranks_size(), 2);
  EXPECT_EQ(status->ranks(0).step(), 5);
  EXPECT_EQ(status->ranks(1).step(), 7);
}

// A rank that finished (or was stopped) while the others train is written at the next flush, so
// a coordinator killed before the generation ends brings it back finished, not active (where it
// would be declared silent).
TEST_F(CoordinatorTest, AFinishedRankStaysFinishedAcrossAKilledCoordinator) {
  std::string run = Submit(1, 2);
  auto a = RegisterAll(run, 1, 2);
  ASSERT_TRUE(Beat(run, a[0], 9).ok());
  v1::LeaveRequest leave;
  leave.set_run_id(run);
  leave.set_rank(0);
  leave.set_generation(a[0].generation());
  leave.set_incarnation("n1-0");
  leave.set_final_step(9);
  ASSERT_TRUE(coord_->health().Leave(leave).ok());
  Advance(absl::Seconds(3));
  coord_->AwaitFileWork();
  Reopen();  // no shutdown write: only what the flushes wrote
  auto status = coord_->GetRun(run);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->ranks_size(), 2);
  EXPECT_EQ(status->ranks(0).state(), v1::RankStatus::FINISHED);
  EXPECT_EQ(status->ranks(0).step(), 9);
  EXPECT_EQ(status->ranks(1).state(), v1::RankStatus::ACTIVE);
}

// Metric batches wait in memory for storage: while a stalled disk holds them, a run may keep at
// most --metric-bytes-per-run of them. The batch past it is refused (RESOURCE_EXHAUSTED naming the
// limit; its sender keeps it and sends it again), other runs go on, and once the disk answers
// the same batch is taken and stored: nothing is lost.
TEST_F(CoordinatorTest, AStalledMetricStoreHoldsAtMostTheRunsMetricBytes) {
  metric_bytes_per_run_ = 4096;
  Reopen();
  std::string run = Submit(1, 1, 0, "busy");
  std::string other = Submit(1, 1, 0, "quiet");
  RegisterAll(run, 1, 1);
  auto batch = [](const std::string& run_id, int64_t step) {
    v1::MetricBatch b;
    b.set_run_id(run_id);
    v1::MetricPoint* p = b.add_points();
    p->set_step(step);
    (*p->mutable_values())["loss"] = 1.0;
    for (char c : std::string("abcdefg")) (*p->mutable_values())[std::string(120, c)] = 2.0;  // about 1 KiB a batch
    return b;
  };
  std::atomic<int> stored{0};
  auto count = [&](const absl::Status& s) {
    EXPECT_TRUE(s.ok()) << s;
    ++stored;
  };
  // Only the metric passes stall: the runs' own file work (their experiment directories, run.json)
  // stalling beside them made the count jump past 1 under load (CI, stop 48).
  coord_->AwaitFileWork();
  stall_.Arm(JoinPath(save_dir_, "(metric storage)"));
  ASSERT_TRUE(coord_->metrics().Ingest(batch(run, 1), count).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return stall_.stalled() == 1; }, absl::Seconds(10)));
  int64_t step = 2;
  absl::Status refused;
  for (; step < 10 && refused.ok(); ++step) refused = coord_->metrics().Ingest(batch(run, step), count);
  --step;  // the refused one
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("limit of 4096 per run (dtcoord --metric-bytes-per-run)"), std::string::npos)
      << refused;
  EXPECT_EQ(step, 5);  // four batches of about 1 KiB fit in 4 KiB, the one being stored among them
  RegisterAll(other, 1, 1);
  EXPECT_TRUE(coord_->metrics().Ingest(batch(other, 1), count).ok()) << "another run's batch waited";
  stall_.Release();
  ASSERT_TRUE(testing::WaitFor([&] { return coord_->metrics().Unstored() == 0; }, absl::Seconds(30)));
  ASSERT_TRUE(coord_->metrics().Ingest(batch(run, step), count).ok());  // sent again: taken
  ASSERT_TRUE(testing::WaitFor([&] { return stored.load() == static_cast<int>(step) + 1; }, absl::Seconds(30)));
  v1::QueryMetricsRequest q;
  q.set_run_id(run);
  q.set_name("loss");
  auto page = coord_->metrics().Query(q);
  ASSERT_TRUE(page.ok()) << page.status();
  std::vector<int64_t> steps;
  for (const auto& m : page->records()) steps.push_back(m.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

// Metric batches are stored off the caller's thread; once the coordinator shuts down it takes no
// more (its file work drains, and a stream fed without end would keep it from returning).
TEST_F(CoordinatorTest, MetricBatchesAreStoredThenRefusedOnceShuttingDown) {
  std::string run = Submit(1, 1);
  RegisterAll(run, 1, 1);
  v1::MetricBatch batch;
  batch.set_run_id(run);
  v1::MetricPoint* p = batch.add_points();
  p->set_step(4);
  (*p->mutable_values())["loss"] = 1.5;
  absl::Notification stored;
  absl::Status result = absl::UnknownError("not called");
  ASSERT_TRUE(coord_->metrics()
                  .Ingest(batch,
                          [&](const absl::Status& s) {
                            result = s;
                            stored.Notify();
                          })
                  .ok());
  ASSERT_TRUE(stored.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(result.ok()) << result;
  // Delivery may trail storage.
  EXPECT_TRUE(testing::WaitFor([&] { return coord_->metrics().Unstored() == 0; }, absl::Seconds(30)));
  v1::QueryMetricsRequest q;
  q.set_run_id(run);
  auto page = coord_->metrics().Query(q);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->records_size(), 1);
  EXPECT_EQ(page->records(0).step(), 4);

  coord_->Shutdown();
  absl::Status refused =
      coord_->metrics().Ingest(batch, [](const absl::Status&) { ADD_FAILURE() << "stored after shutdown"; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("shutting down"), std::string::npos) << refused;
}

// A stream reads its next batch once the last is stored, not once Prometheus and W&B have it (a
// slow observer would hold every stream), but no further than MetricPipeline::kMaxUndeliveredBatches
// ahead of delivery: a stalled observer cannot make the coordinator hold batches without bound.
TEST_F(CoordinatorTest, MetricStreamsWaitForStorageAndForDeliveryOnlyPastTheBound) {
  testing::HeldMetricObserver observer;
  coord_->AddObserver(&observer);
  std::string run = Submit(1, 1);
  RegisterAll(run, 1, 1);
  auto batch = [&](int step) {
    v1::MetricBatch b;
    b.set_run_id(run);
    v1::MetricPoint* p = b.add_points();
    p->set_step(step);
    (*p->mutable_values())["loss"] = 1.0 / step;
    return b;
  };
  absl::Mutex mu;
  int stored = 0;
  auto count = [&](const absl::Status& s) {
    EXPECT_TRUE(s.ok()) << s;
    absl::MutexLock lock(&mu);
    ++stored;
  };
  auto stored_count = [&] {
    absl::MutexLock lock(&mu);
    return stored;
  };
  // Also when an assertion returns early: the coordinator's file work drains as it goes (calling
  // `count`), and it must be gone before the observer and `count`'s state are.
  absl::Cleanup release = [&] {
    observer.Release();
    coord_.reset();
  };
  // The first batch is stored while its delivery is held.
  ASSERT_TRUE(coord_->metrics().Ingest(batch(1), count).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return stored_count() == 1 && observer.delivered() == 1; }, absl::Seconds(30)));
  // Batches that each wait for the last to be stored, as a stream's do, up to the bound.
  const int64_t bound = Coordinator::MetricPipeline::kMaxUndeliveredBatches;
  for (int step = 2; step <= bound; ++step) {
    ASSERT_TRUE(coord_->metrics().Ingest(batch(step), count).ok());
    ASSERT_TRUE(testing::WaitFor([&] { return stored_count() == step; }, absl::Seconds(30))) << step;
  }
  auto records = [&] {
    v1::QueryMetricsRequest q;
    q.set_run_id(run);
    auto page = coord_->metrics().Query(q);
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? page->records_size() : -1;
  };
  // One past the bound is stored in SQLite, and its `stored` waits for delivery. (The next batch
  // goes to the next storage pass, which starts once that batch's pass has decided.)
  ASSERT_TRUE(coord_->metrics().Ingest(batch(bound + 1), count).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return records() == bound + 1; }, absl::Seconds(30)));
  ASSERT_TRUE(coord_->metrics().Ingest(batch(bound + 2), count).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return records() == bound + 2; }, absl::Seconds(30)));
  EXPECT_EQ(stored_count(), bound);
  EXPECT_EQ(coord_->metrics().Unstored(), bound + 2);
  observer.Release();
  EXPECT_TRUE(testing::WaitFor([&] { return stored_count() == bound + 2 && coord_->metrics().Unstored() == 0; },
                               absl::Seconds(30)));
  EXPECT_EQ(observer.delivered(), bound + 2);
}

// A stream ends (metrics().WhenDelivered, asked once its last batch is stored) only after that
// batch's delivery, even when the batch was stored long before it is delivered.
TEST_F(CoordinatorTest, AStreamsEndWaitsForTheDeliveryOfItsLastBatch) {
  testing::HeldMetricObserver observer;
  coord_->AddObserver(&observer);
  std::string run = Submit(1, 1);
  RegisterAll(run, 1, 1);
  absl::Notification stored, ended;
  absl::Cleanup release = [&] {
    observer.Release();
    coord_.reset();
  };
  v1::MetricBatch batch;
  batch.set_run_id(run);
  v1::MetricPoint* p = batch.add_points();
  p->set_step(3);
  (*p->mutable_values())["loss"] = 0.25;
  ASSERT_TRUE(coord_->metrics()
                  .Ingest(batch,
                          [&](const absl::Status& s) {
                            EXPECT_TRUE(s.ok()) << s;
                            // As MetricsReader does when the client then closes its side.
                            coord_->metrics().WhenDelivered([&] { ended.Notify(); });
                            stored.Notify();
                          })
                  .ok());
  ASSERT_TRUE(stored.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(testing::WaitFor([&] { return observer.delivered() == 1; }, absl::Seconds(30)));
  EXPECT_FALSE(ended.HasBeenNotified());  // the delivery is held
  observer.Release();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

// An observer that buffers a delivery pass (the W&B spool writes each pass once) has finished it
// before the stream that sent its batches ends: a stream answered OK has its points there.
TEST_F(CoordinatorTest, AStreamEndsOnlyAfterTheObserversHaveEndedThePassOfItsBatches) {
  class PassObserver : public RunObserver {
   public:
    void OnRunChanged(const v1::Run&) override {}
    void OnMetrics(const v1::Run&, const v1::MetricBatch&) override {
      absl::MutexLock lock(&mu);
      ++given;
    }
    void OnMetricPassEnd() override {
      absl::MutexLock lock(&mu);
      ended = given;
    }
    absl::Mutex mu;
    int given ABSL_GUARDED_BY(mu) = 0;
    int ended ABSL_GUARDED_BY(mu) = 0;  // batches given before the last pass's end
  };
  PassObserver observer;
  coord_->AddObserver(&observer);
  std::string run = Submit(1, 1);
  RegisterAll(run, 1, 1);
  absl::Cleanup gone = [&] { coord_.reset(); };  // its file work drains before `observer` goes
  absl::Notification done;
  int ended_at_stream_end = -1;
  for (int step = 1; step <= 3; ++step) {
    v1::MetricBatch batch;
    batch.set_run_id(run);
    v1::MetricPoint* p = batch.add_points();
    p->set_step(step);
    (*p->mutable_values())["loss"] = 1.0 / step;
    ASSERT_TRUE(coord_->metrics()
                    .Ingest(batch,
                            [&, step](const absl::Status& s) {
                              EXPECT_TRUE(s.ok()) << s;
                              if (step != 3) return;
                              coord_->metrics().WhenDelivered([&] {
                                absl::MutexLock lock(&observer.mu);
                                ended_at_stream_end = observer.ended;
                                done.Notify();
                              });
                            })
                    .ok());
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(ended_at_stream_end, 3) << "the stream ended before the pass of its last batch was ended";
}

// The admin's dtctl passes a run's job id to scancel and squeue: a run token must not be able to
// record "--user=root" (scancel would cancel every job of root) or terminal escapes.
TEST_F(CoordinatorTest, AttachLaunchTakesOnlyTheSchedulersJobIdForm) {
  v1::RunSpec spec = testing::MakeSpec("slurm-run", save_dir_, 1, 1, 0);
  spec.set_scheduler(v1::SLURM);
  auto submitted = coord_->SubmitRun(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::string slurm_run = submitted->run_id();
  std::string local_run = Submit(1, 1, 0, "local-run");
  auto attach = [&](const std::string& run, const std::string& id) {
    v1::AttachLaunchRequest req;
    req.set_run_id(run);
    req.set_scheduler_job_id(id);
    return coord_->AttachLaunch(req);
  };
  for (const char* good : {"1234", "1234_7", "1234+1"}) {
    auto r = attach(slurm_run, good);
    ASSERT_TRUE(r.ok()) << good << ": " << r.status();
    EXPECT_EQ(r->scheduler_job_id(), good);
  }
  for (const char* bad : {"--user=root", "-1", "12 34", "1234\x1b[2J", "", "1234_", "_7", "12345678901", "local:99"}) {
    auto r = attach(slurm_run, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("Slurm job id"), std::string::npos) << r.status();
  }
  EXPECT_EQ(coord_->GetRun(slurm_run)->scheduler_job_id(), "1234+1");  // the refused ones changed nothing
  EXPECT_TRUE(attach(local_run, "local:4242").ok());
  EXPECT_EQ(attach(local_run, "4242").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attach(local_run, "local:--all").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, HangIsDetectedWhileEveryoneHeartbeats) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2);
  for (int step = 1; step <= 3; ++step) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run, ranks[0], step).ok());
    ASSERT_TRUE(Beat(run, ranks[1], step).ok());
  }
  for (int i = 0; i < 302; ++i) {  // 10 min 4 s of heartbeats at step 3
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run, ranks[0], 3).ok());
    ASSERT_TRUE(Beat(run, ranks[1], 3).ok());
  }
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->state(), v1::FAILED);
  EXPECT_EQ(status->reason().kind(), v1::Failure::HANG);
  EXPECT_NE(status->reason().message().find("step 3"), std::string::npos) << status->reason().message();
}

TEST_F(CoordinatorTest, ReplacedIncarnationRestartsTheGroup) {
  std::string run = Submit(1, 2, /*max_restarts=*/2);
  RegisterAll(run, 1, 2);
  Reply<v1::RegisterResponse> restarted;
  coord_->registration().Register(RegisterRequest(run, "n1", 1, "fresh-process"), restarted.pending());
  EXPECT_FALSE(restarted.arrived());  // waits in generation 1
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->generation(), 1);
  EXPECT_EQ(status->reason().kind(), v1::Failure::REPLACED);
  EXPECT_EQ(status->state(), v1::RENDEZVOUS);
}

TEST_F(CoordinatorTest, EveryRankLeavingMeansSuccess) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2);
  for (int r = 0; r < 2; ++r) {
    v1::LeaveRequest leave;
    leave.set_run_id(run);
    leave.set_rank(r);
    leave.set_generation(0);
    leave.set_incarnation("n1-" + std::to_string(r));
    leave.set_final_step(100);
    auto out = coord_->health().Leave(leave);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->run_state(), r == 0 ? v1::RUNNING : v1::SUCCEEDED);
  }
  EXPECT_EQ(coord_->GetRun(run)->step(), 100);
}

// Every rank leaving after the preemption checkpoint requeues the run: a new generation waits for
// the requeued job without spending a restart; once --max-requeues is spent the run fails.
TEST_F(CoordinatorTest, RanksLeavingForAPreemptionRequeueTheRunUntilTheRequeuesAreSpent) {
  v1::RunSpec spec = testing::MakeSpec("preempt", save_dir_, 1, 2);
  spec.set_max_requeues(1);
  auto submitted = coord_->SubmitRun(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::string run = submitted->run_id();
  auto leave_all = [&](int64_t generation, const std::string& incarnation_prefix, int64_t step,
                       bool time_limit = false) {
    for (int r = 0; r < 2; ++r) {
      v1::LeaveRequest leave;
      leave.set_run_id(run);
      leave.set_rank(r);
      leave.set_generation(generation);
      leave.set_incarnation(incarnation_prefix + std::to_string(r));
      leave.set_final_step(step);
      leave.set_preempted(true);
      leave.set_signal(SIGUSR2);
      leave.set_time_limit(time_limit && r == 1);  // one rank that saw the job's end near is enough
      auto out = coord_->health().Leave(leave);
      ASSERT_TRUE(out.ok()) << out.status();
    }
  };
  RegisterAll(run, 1, 2);
  leave_all(0, "n1-", 40);
  absl::StatusOr<v1::Run> r = coord_->GetRun(run);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::REQUEUED);
  EXPECT_EQ(r->preemptions(), 1);
  EXPECT_EQ(r->restarts(), 0);
  EXPECT_EQ(r->generation(), 1);
  EXPECT_EQ(r->reason().kind(), v1::Failure::PREEMPTED);
  EXPECT_NE(r->reason().message().find("SIGUSR2"), std::string::npos) << r->reason().message();
  EXPECT_NE(r->reason().message().find("checkpointed at step 40"), std::string::npos) << r->reason().message();
  // The requeued job's trainers (new processes) form generation 1.
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> replies;
  for (int s = 0; s < 2; ++s) {
    replies.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
    coord_->registration().Register(RegisterRequest(run, "n1", s, "again-" + std::to_string(s)),
                                    replies.back()->pending());
  }
  for (auto& reply : replies) ASSERT_TRUE(reply->arrived() && reply->value.ok());
  EXPECT_EQ(State(run), v1::RUNNING);
  // A second stop, this time for the job's time limit, with the one requeue spent: FAILED,
  // named TIME_LIMIT and naming the flag.
  leave_all(1, "again-", 60, /*time_limit=*/true);
  r = coord_->GetRun(run);
  EXPECT_EQ(r->state(), v1::FAILED);
  EXPECT_EQ(r->preemptions(), 1);
  EXPECT_EQ(r->reason().kind(), v1::Failure::TIME_LIMIT);
  EXPECT_NE(r->reason().message().find("reached its time limit"), std::string::npos) << r->reason().message();
  EXPECT_NE(r->reason().message().find("--max-requeues"), std::string::npos) << r->reason().message();
  // A bad signal is refused.
  v1::LeaveRequest bad;
  bad.set_run_id(run);
  bad.set_signal(99);
  EXPECT_EQ(coord_->health().Leave(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A failed node is recorded once (NODE_FAILED with the evidence, the run's excluded nodes), bad
// input is refused with the cause named, and an ended run takes no more.
TEST_F(CoordinatorTest, ExcludedNodesAreRecordedOnceAndValidated) {
  std::string run = Submit(2, 1);
  RegisterAll(run, 2, 1);
  auto exclude = [&](std::vector<std::pair<std::string, std::string>> nodes) {
    v1::ExcludeNodesRequest request;
    request.set_run_id(run);
    for (auto& [node, evidence] : nodes) {
      v1::FailedNode* n = request.add_nodes();
      n->set_node(node);
      n->set_evidence(evidence);
    }
    return coord_->ExcludeNodes(request);
  };
  absl::StatusOr<v1::Run> r = exclude({{"n2", "Slurm reports it DOWN+NOT_RESPONDING: Not responding"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->excluded_nodes(), ::testing::ElementsAre("n2"));
  EXPECT_EQ(r->reason().kind(), v1::Failure::NODE_FAILED);
  EXPECT_EQ(r->reason().node(), "n2");
  EXPECT_NE(r->reason().message().find("DOWN+NOT_RESPONDING"), std::string::npos) << r->reason().message();
  size_t failures = r->failures_size();
  // Again (the batch script of a second requeue): nothing new is recorded.
  r = exclude({{"n2", "again"}, {"n2", "twice in one call"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->excluded_nodes_size(), 1);
  EXPECT_EQ(static_cast<size_t>(r->failures_size()), failures);
  EXPECT_THAT(coord_->GetRun(run)->excluded_nodes(), ::testing::ElementsAre("n2"));

  EXPECT_EQ(exclude({}).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = exclude({{"--user=root", ""}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("node"), std::string::npos) << bad.status();
  EXPECT_EQ(exclude({{"n3", std::string(5000, 'x')}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(exclude({{"n3", "\xff\xfe"}}).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::pair<std::string, std::string>> many;
  for (int k = 0; k < 65; ++k) many.push_back({"x" + std::to_string(k), ""});
  EXPECT_EQ(exclude(many).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ExcludeNodesRequest unknown;
  unknown.set_run_id("r-00000000000000ff");
  unknown.add_nodes()->set_node("n1");
  EXPECT_EQ(coord_->ExcludeNodes(unknown).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(coord_->CancelRun(run, "done").ok());
  EXPECT_EQ(exclude({{"n3", ""}}).status().code(), absl::StatusCode::kFailedPrecondition);
}

v1::ReportPreflightRequest PreflightReport(const std::string& run, const v1::RegisterResponse& a, double ms,
                                           const std::string& error = "") {
  v1::ReportPreflightRequest req;
  req.set_run_id(run);
  req.set_rank(a.rank());
  req.set_generation(a.generation());
  req.set_incarnation("n" + std::to_string(a.node_rank() + 1) + "-" + std::to_string(a.local_rank()));
  req.mutable_result()->set_device("cpu (1 thread(s))");
  req.mutable_result()->set_matmul_size(512);
  req.mutable_result()->set_matmul_seconds(ms / 1e3);
  req.mutable_result()->set_allreduce_seconds(0.002);
  req.mutable_result()->set_error(error);
  return req;
}

// On Slurm a rank whose device is far slower than the others' fails the generation once every
// rank reported: NODE_UNHEALTHY names it, its node joins the excluded nodes (the batch script
// requeues the job without it), and the run restarts within its budget.
TEST_F(CoordinatorTest, ASlowDeviceOnSlurmFailsTheGenerationAndExcludesItsNode) {
  v1::RunSpec spec = testing::MakeSpec("slow", save_dir_, 3, 1, /*max_restarts=*/1);
  spec.set_scheduler(v1::SLURM);
  std::string run = coord_->SubmitRun(spec)->run_id();
  auto ranks = RegisterAll(run, 3, 1);
  auto first = coord_->health().ReportPreflight(PreflightReport(run, ranks[0], 9));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->unhealthy().empty());
  ASSERT_TRUE(coord_->health().ReportPreflight(PreflightReport(run, ranks[2], 75)).ok());
  EXPECT_EQ(State(run), v1::RUNNING);  // not judged before every rank reported
  auto last = coord_->health().ReportPreflight(PreflightReport(run, ranks[1], 10));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_THAT(last->unhealthy(), ::testing::HasSubstr("rank 2"));
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::RESTARTING);
  EXPECT_EQ(r.restarts(), 1);
  EXPECT_EQ(r.reason().kind(), v1::Failure::NODE_UNHEALTHY);
  EXPECT_EQ(r.reason().rank(), 2);
  EXPECT_EQ(r.reason().node(), "n3");
  EXPECT_THAT(r.reason().message(), ::testing::HasSubstr("took 75.0 ms, 7.5x the median"));
  EXPECT_THAT(r.reason().message(), ::testing::HasSubstr("node n3 excluded from the job"));
  EXPECT_THAT(r.excluded_nodes(), ::testing::ElementsAre("n3"));
  // Every rank hears it with its next heartbeat.
  auto beat = Beat(run, ranks[0], 0);
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->directive(), v1::HeartbeatResponse::STOP);
  // A late report of the ended generation is refused naming why it ended.
  auto late = coord_->health().ReportPreflight(PreflightReport(run, ranks[0], 9));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(late.status().message(), ::testing::HasSubstr("pre-flight"));
  // The exclusion survives a coordinator restart.
  Reopen();
  EXPECT_THAT(coord_->GetRun(run)->excluded_nodes(), ::testing::ElementsAre("n3"));
}

// On one machine there is no node to leave out: the timings are shown, speed is not judged; a
// device error still fails the generation at once, without waiting for the others.
TEST_F(CoordinatorTest, ALocalRunShowsPreflightsAndFailsOnlyOnADeviceError) {
  std::string run = Submit(1, 3, /*max_restarts=*/1);
  auto ranks = RegisterAll(run, 1, 3);
  ASSERT_TRUE(coord_->health().ReportPreflight(PreflightReport(run, ranks[0], 9)).ok());
  ASSERT_TRUE(coord_->health().ReportPreflight(PreflightReport(run, ranks[1], 90)).ok());
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::RUNNING);
  EXPECT_DOUBLE_EQ(r.ranks(1).preflight().matmul_seconds(), 0.09);
  EXPECT_EQ(r.ranks(1).preflight().device(), "cpu (1 thread(s))");
  EXPECT_FALSE(r.ranks(2).has_preflight());
  auto failed = coord_->health().ReportPreflight(
      PreflightReport(run, ranks[2], 0, "CUDA error: uncorrectable ECC error encountered"));
  ASSERT_TRUE(failed.ok()) << failed.status();
  r = *coord_->GetRun(run);
  EXPECT_EQ(r.reason().kind(), v1::Failure::NODE_UNHEALTHY);
  EXPECT_EQ(r.reason().rank(), 2);
  EXPECT_THAT(r.reason().message(), ::testing::HasSubstr("uncorrectable ECC error"));
  EXPECT_EQ(r.excluded_nodes_size(), 0);
  EXPECT_EQ(r.state(), v1::RESTARTING);
}

TEST_F(CoordinatorTest, ReportPreflightValidatesItsFields) {
  std::string run = Submit(1, 2);
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> waiting;
  waiting.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
  coord_->registration().Register(RegisterRequest(run, "n1", 0), waiting.back()->pending());
  v1::RegisterResponse fake;
  fake.set_rank(0);
  auto early = coord_->health().ReportPreflight(PreflightReport(run, fake, 9));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  waiting.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
  coord_->registration().Register(RegisterRequest(run, "n1", 1), waiting.back()->pending());
  ASSERT_TRUE(waiting[0]->arrived() && waiting[0]->value.ok());
  v1::RegisterResponse a = *waiting[0]->value;
  for (double bad : {-1.0, std::nan(""), 1e9}) {
    v1::ReportPreflightRequest req = PreflightReport(run, a, 9);
    req.mutable_result()->set_matmul_seconds(bad);
    auto refused = coord_->health().ReportPreflight(req);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("matmul_seconds")) << refused.status();
  }
  v1::ReportPreflightRequest size = PreflightReport(run, a, 9);
  size.mutable_result()->set_matmul_size(-4);
  EXPECT_EQ(coord_->health().ReportPreflight(size).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ReportPreflightRequest out_of_range = PreflightReport(run, a, 9);
  out_of_range.set_rank(2);
  EXPECT_EQ(coord_->health().ReportPreflight(out_of_range).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ReportPreflightRequest replaced = PreflightReport(run, a, 9);
  replaced.set_incarnation("someone-else");
  EXPECT_EQ(coord_->health().ReportPreflight(replaced).status().code(), absl::StatusCode::kAborted);
  v1::ReportPreflightRequest unknown = PreflightReport("r-00000000000000ff", a, 9);
  EXPECT_EQ(coord_->health().ReportPreflight(unknown).status().code(), absl::StatusCode::kNotFound);
  // The first report counts; a retry changes nothing.
  ASSERT_TRUE(coord_->health().ReportPreflight(PreflightReport(run, a, 9)).ok());
  ASSERT_TRUE(coord_->health().ReportPreflight(PreflightReport(run, a, 50)).ok());
  EXPECT_DOUBLE_EQ(coord_->GetRun(run)->ranks(0).preflight().matmul_seconds(), 0.009);
  ASSERT_TRUE(coord_->CancelRun(run, "done").ok());
  EXPECT_EQ(coord_->health().ReportPreflight(PreflightReport(run, a, 9)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, CancelStopsEverythingAndIsHarmlessTwice) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2);
  auto c = coord_->CancelRun(run, "user asked");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state(), v1::CANCELLED);
  auto hb = Beat(run, ranks[0], 1);
  EXPECT_EQ(hb->directive(), v1::HeartbeatResponse::STOP);
  EXPECT_NE(hb->reason().find("CANCELLED"), std::string::npos) << hb->reason();
  EXPECT_EQ(coord_->CancelRun(run, "again")->state(), v1::CANCELLED);
  EXPECT_EQ(coord_->CancelRun("r-00000000000000ff", "").status().code(), absl::StatusCode::kNotFound);
}

// ---- Checkpoint rounds ----------------------------------------------------------------------

class CheckpointRoundTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    auto spec = testing::MakeSpec("ckpt", save_dir_, 1, 2);
    spec.set_keep_checkpoints(2);
    run_ = coord_->SubmitRun(spec)->run_id();
    ranks_ = RegisterAll(run_, 1, 2);
  }

  // Both ranks begin the round for `step`; returns rank 0's view.
  v1::BeginCheckpointResponse Begin(int64_t step) {
    Reply<v1::BeginCheckpointResponse> r0, r1;
    for (int r = 0; r < 2; ++r) {
      v1::BeginCheckpointRequest req;
      req.set_run_id(run_);
      req.set_generation(0);
      req.set_rank(r);
      req.set_step(step);
      coord_->checkpoints().Begin(req, r == 0 ? r0.pending() : r1.pending());
    }
    EXPECT_TRUE(r0.WaitFor() && r1.WaitFor());  // the partial directory is made on the file work
    EXPECT_TRUE(r0.value.ok()) << r0.value.status();
    EXPECT_EQ(r0.value->round_id(), r1.value->round_id());
    return *r0.value;
  }

  v1::Manifest WriteFiles(const std::string& dir, const std::string& payload) {
    v1::Manifest m;
    std::ofstream(JoinPath(dir, "model.pt"), std::ios::binary) << payload;
    auto* f = m.add_files();
    f->set_name("model.pt");
    f->set_size(static_cast<int64_t>(payload.size()));
    f->set_sha256(Sha256Hex(payload));
    return m;
  }

  void Commit(int rank, const v1::BeginCheckpointResponse& round, const v1::Manifest* m,
              Reply<v1::CommitCheckpointResponse>* out) {
    v1::CommitCheckpointRequest req;
    req.set_run_id(run_);
    req.set_generation(0);
    req.set_rank(rank);
    req.set_round_id(round.round_id());
    if (m != nullptr) *req.mutable_manifest() = *m;
    coord_->checkpoints().Commit(req, out->pending());
  }

  // A whole successful round at `step`: rank 1 waits, rank 0 writes `payload` and commits.
  void CommitStep(int64_t step, const std::string& payload) {
    v1::BeginCheckpointResponse round = Begin(step);
    v1::Manifest m = WriteFiles(round.partial_dir(), payload);
    Reply<v1::CommitCheckpointResponse> c0, c1;
    Commit(1, round, nullptr, &c1);
    Commit(0, round, &m, &c0);
    ASSERT_TRUE(c0.WaitFor() && c1.WaitFor());
    ASSERT_TRUE(c0.value.ok()) << c0.value.status();
  }

  std::string Latest() { return testing::LatestIn(ckpt_dir()); }
  std::string ckpt_dir() { return save_dir_ + "/ckpt/checkpoints"; }
  bool AnyPartial() { return testing::AnyPartialIn(ckpt_dir()); }

  std::string run_;
  std::vector<v1::RegisterResponse> ranks_;
};

TEST_F(CheckpointRoundTest, OneWriterCommitsAndEveryRankIsReleased) {
  v1::BeginCheckpointResponse round = Begin(10);
  EXPECT_EQ(round.writer_rank(), 0);
  EXPECT_TRUE(fs::is_directory(round.partial_dir()));
  EXPECT_NE(round.partial_dir().find("step-10.partial-"), std::string::npos);
  Reply<v1::CommitCheckpointResponse> c0, c1;
  Commit(1, round, nullptr, &c1);
  EXPECT_FALSE(c1.arrived());  // waits for the writer
  v1::Manifest m = WriteFiles(round.partial_dir(), "weights-at-10");
  Commit(0, round, &m, &c0);
  ASSERT_TRUE(c0.WaitFor() && c1.WaitFor());
  ASSERT_TRUE(c0.value.ok()) << c0.value.status();
  ASSERT_TRUE(c1.value.ok());
  EXPECT_EQ(c1.value->checkpoint().step(), 10);
  EXPECT_EQ(Latest(), "step-10");
  EXPECT_FALSE(AnyPartial());
  EXPECT_EQ(coord_->checkpoints().Latest(run_)->step(), 10);
  EXPECT_EQ(coord_->GetRun(run_)->latest_checkpoint_step(), 10);
}

// Any rank's failure in its block aborts the round: the writer's files wait for every rank's
// commit, and a non-writer's AbortCheckpoint before it ends the round with its reason.
TEST_F(CheckpointRoundTest, ANonWritersAbortBeforeItsCommitAbortsTheRound) {
  CommitStep(5, "weights-at-5");
  v1::BeginCheckpointResponse round = Begin(10);
  ASSERT_EQ(round.writer_rank(), 0);
  v1::Manifest m = WriteFiles(round.partial_dir(), "weights-at-10");
  Reply<v1::CommitCheckpointResponse> c0;
  Commit(0, round, &m, &c0);
  coord_->AwaitFileWork();
  EXPECT_FALSE(c0.arrived());  // nothing is published before rank 1 has committed
  EXPECT_EQ(Latest(), "step-5");
  v1::AbortCheckpointRequest abort;
  abort.set_run_id(run_);
  abort.set_generation(0);
  abort.set_rank(1);
  abort.set_round_id(round.round_id());
  abort.set_reason("ValueError: a bad batch");
  Reply<v1::AbortCheckpointResponse> first;
  coord_->checkpoints().Abort(abort, first.pending());
  ASSERT_TRUE(first.WaitFor());
  ASSERT_TRUE(first.value.ok()) << first.value.status();
  EXPECT_EQ(first.value->already_ended(), "");  // this call ended the round
  EXPECT_FALSE(AnyPartial());                   // and heard so behind the removal of its directory
  // A later abort (the writer, whose files the first abort removed) learns why the round ended,
  // also behind the removal: a rank that exits on it leaves nothing of the round behind.
  Reply<v1::AbortCheckpointResponse> again;
  coord_->checkpoints().Abort(abort, again.pending());
  ASSERT_TRUE(again.WaitFor());
  ASSERT_TRUE(again.value.ok()) << again.value.status();
  EXPECT_NE(again.value->already_ended().find("rank 1 aborted the checkpoint at step 10"), std::string::npos)
      << again.value->already_ended();
  EXPECT_FALSE(AnyPartial());
  ASSERT_TRUE(c0.WaitFor());
  EXPECT_EQ(c0.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(c0.value.status().message().find("rank 1 aborted the checkpoint at step 10: ValueError: a bad batch"),
            std::string::npos)
      << c0.value.status();
  coord_->AwaitFileWork();
  EXPECT_EQ(Latest(), "step-5");
  EXPECT_FALSE(AnyPartial());
  // A rank's abort after every rank committed changes nothing.
  CommitStep(15, "weights-at-15");
  abort.set_round_id("gone");
  Reply<v1::AbortCheckpointResponse> unknown;
  coord_->checkpoints().Abort(abort, unknown.pending());
  ASSERT_TRUE(unknown.WaitFor());
  EXPECT_EQ(unknown.value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Latest(), "step-15");
}

TEST_F(CheckpointRoundTest, RetentionKeepsTheLastK) {
  for (int64_t step : {10, 20, 30}) ASSERT_NO_FATAL_FAILURE(CommitStep(step, "w" + std::to_string(step)));
  coord_->AwaitFileWork();  // the retired checkpoint is removed after the ranks heard of the commit
  EXPECT_FALSE(fs::exists(ckpt_dir() + "/step-10"));
  EXPECT_TRUE(fs::exists(ckpt_dir() + "/step-20"));
  EXPECT_TRUE(fs::exists(ckpt_dir() + "/step-30"));
  auto list = coord_->checkpoints().List(run_);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step(), 20);
}

// Removing a retired checkpoint (0.3 s for 256 MB on an ext4 disk with discard, seconds on a
// file server) must not hold up the next round's Begin, on which the ranks' training loop waits;
// the next publication still waits for it, so a retired directory is gone before a newer lands.
TEST_F(CheckpointRoundTest, ANewRoundBeginsWhileTheLastCommitsRetentionPassWaits) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "w10"));
  ASSERT_NO_FATAL_FAILURE(CommitStep(20, "w20"));
  // Step 20's own retention pass done first: on a loaded machine it could still be queued, be the
  // one the stall below catches, and hold step 30's publication behind it.
  coord_->AwaitFileWork();
  // Released below; by itself only after 60 s, so that a slow (sanitizer) build cannot see the
  // pass run before the checks that it is still waiting.
  stall_.Arm("(retention)", absl::Seconds(60));
  absl::Cleanup release = [&] { stall_.Release(); };
  ASSERT_NO_FATAL_FAILURE(CommitStep(30, "w30"));  // the ranks hear of the commit before the pass
  ASSERT_TRUE(testing::WaitFor([&] { return stall_.waiting() == 1; }, absl::Seconds(2)));
  v1::BeginCheckpointResponse next = Begin(40);
  EXPECT_EQ(stall_.waiting(), 1) << "the Begin waited for the retention pass";
  EXPECT_TRUE(fs::exists(next.partial_dir()));
  EXPECT_TRUE(fs::exists(ckpt_dir() + "/step-10"));  // the pass has not run
  v1::Manifest m = WriteFiles(next.partial_dir(), "w40");
  Reply<v1::CommitCheckpointResponse> c0, c1;
  Commit(1, next, nullptr, &c1);
  Commit(0, next, &m, &c0);
  EXPECT_FALSE(c0.WaitFor(absl::Milliseconds(300))) << "step 40 was published before step 10 was removed";
  EXPECT_EQ(stall_.waiting(), 1);
  stall_.Release();
  ASSERT_TRUE(c0.WaitFor() && c1.WaitFor());
  ASSERT_TRUE(c0.value.ok()) << c0.value.status();
  coord_->AwaitFileWork();
  EXPECT_FALSE(fs::exists(ckpt_dir() + "/step-10"));
  EXPECT_FALSE(fs::exists(ckpt_dir() + "/step-20"));
  EXPECT_TRUE(fs::exists(ckpt_dir() + "/step-30"));
  EXPECT_EQ(Latest(), "step-40");
}

TEST_F(CheckpointRoundTest, CorruptFilesAbortTheRoundAndLatestStays) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "ok"));
  v1::BeginCheckpointResponse bad = Begin(20);
  v1::Manifest lie = WriteFiles(bad.partial_dir(), "real");
  lie.mutable_files(0)->set_size(lie.files(0).size() + 1);  // the coordinator checks sizes
  Reply<v1::CommitCheckpointResponse> b0, b1;
  Commit(1, bad, nullptr, &b1);
  Commit(0, bad, &lie, &b0);
  ASSERT_TRUE(b0.WaitFor() && b1.WaitFor());
  EXPECT_EQ(b0.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(b1.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Latest(), "step-10");
  EXPECT_FALSE(AnyPartial());
}

// A writer's manifest the coordinator refuses ends the round at once for every rank: left open,
// the others would wait out the lease (10 minutes) for a commit that cannot come.
TEST_F(CheckpointRoundTest, AWritersMalformedManifestAbortsTheRoundAtOnce) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(5, "weights-at-5"));
  v1::BeginCheckpointResponse round = Begin(10);
  v1::Manifest bad = WriteFiles(round.partial_dir(), "weights-at-10");
  bad.mutable_files(0)->set_sha256("not a digest");
  Reply<v1::CommitCheckpointResponse> c0, c1, late;
  Commit(1, round, nullptr, &c1);
  Commit(0, round, &bad, &c0);
  ASSERT_TRUE(c0.WaitFor() && c1.WaitFor());  // no clock advanced: no lease lapsed
  EXPECT_EQ(c0.value.status().code(), absl::StatusCode::kInvalidArgument) << c0.value.status();
  EXPECT_NE(c0.value.status().message().find("sha256"), std::string::npos) << c0.value.status();
  EXPECT_EQ(c1.value.status().code(), absl::StatusCode::kAborted) << c1.value.status();
  EXPECT_NE(c1.value.status().message().find("sha256"), std::string::npos) << c1.value.status();
  EXPECT_FALSE(fs::exists(round.partial_dir()));
  Commit(1, round, nullptr, &late);  // a rank that commits after the abort hears it too
  ASSERT_TRUE(late.WaitFor());
  EXPECT_EQ(late.value.status().code(), absl::StatusCode::kAborted) << late.value.status();
  EXPECT_EQ(Latest(), "step-5");
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "weights-at-10"));  // the step can be taken again
  EXPECT_EQ(Latest(), "step-10");
}

TEST_F(CheckpointRoundTest, LapsedLeaseAbortsTheRoundAndRemovesThePartialDirectory) {
  v1::BeginCheckpointResponse round = Begin(10);
  Reply<v1::CommitCheckpointResponse> c1;
  Commit(1, round, nullptr, &c1);
  // The writer keeps heartbeating but never commits.
  for (int i = 0; i < 310; ++i) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run_, ranks_[0], 9).ok());
    ASSERT_TRUE(Beat(run_, ranks_[1], 9).ok());
    if (c1.arrived()) break;
  }
  ASSERT_TRUE(c1.WaitFor());  // the abort is delivered once the partial directory is gone
  EXPECT_EQ(c1.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(c1.value.status().message().find("lease"), std::string::npos) << c1.value.status();
  EXPECT_FALSE(fs::exists(round.partial_dir()));
  EXPECT_EQ(Latest(), "");
}

TEST_F(CheckpointRoundTest, WriterDeathMidRoundLeavesLatestAndNoPartial) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "ok"));
  v1::BeginCheckpointResponse round = Begin(20);
  WriteFiles(round.partial_dir(), "half-writ");  // the writer dies before committing
  Reply<v1::CommitCheckpointResponse> c1;
  Commit(1, round, nullptr, &c1);
  for (int i = 0; i < 20 && !c1.arrived(); ++i) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run_, ranks_[1], 19).ok());  // only the non-writer is alive
  }
  ASSERT_TRUE(c1.WaitFor());
  EXPECT_EQ(c1.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(c1.value.status().message().find("rank 0"), std::string::npos) << c1.value.status();
  EXPECT_EQ(Latest(), "step-10");
  EXPECT_FALSE(AnyPartial());
}

TEST_F(CheckpointRoundTest, RanksMustAgreeOnTheStep) {
  Reply<v1::BeginCheckpointResponse> r0, r1;
  v1::BeginCheckpointRequest req;
  req.set_run_id(run_);
  req.set_generation(0);
  req.set_rank(0);
  req.set_step(10);
  coord_->checkpoints().Begin(req, r0.pending());
  req.set_rank(1);
  req.set_step(11);
  coord_->checkpoints().Begin(req, r1.pending());
  EXPECT_EQ(r1.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r1.value.status().message().find("disagree"), std::string::npos);
}

TEST_F(CheckpointRoundTest, ANewRunInTheSameDirectoryResumesFromLatest) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "w"));
  ASSERT_TRUE(coord_->CancelRun(run_, "").ok());
  auto next = coord_->SubmitRun(testing::MakeSpec("ckpt", save_dir_, 1, 2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->resume_step(), 10);
  auto assigned = RegisterAll(next->run_id(), 1, 2);
  EXPECT_EQ(assigned[0].resume().step(), 10);
}

// `dtctl checkpoints` of a resumed run: the checkpoint it resumed from comes first, then its own,
// and it is left out once it is no longer on disk.
TEST_F(CheckpointRoundTest, ARunListsTheCheckpointItResumedFromWhileItIsOnDisk) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "w"));
  ASSERT_TRUE(coord_->CancelRun(run_, "").ok());
  auto next = coord_->SubmitRun(testing::MakeSpec("ckpt", save_dir_, 1, 2));
  ASSERT_TRUE(next.ok()) << next.status();
  run_ = next->run_id();
  auto list = coord_->checkpoints().List(run_);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 10);

  ranks_ = RegisterAll(run_, 1, 2);
  ASSERT_NO_FATAL_FAILURE(CommitStep(20, "w20"));
  list = coord_->checkpoints().List(run_);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step(), 10);
  EXPECT_EQ((*list)[1].step(), 20);

  fs::remove_all(ckpt_dir() + "/step-10");
  list = coord_->checkpoints().List(run_);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 20);
}

TEST_F(CheckpointRoundTest, AnotherSpellingOfTheDirectoryIsRefusedAndTheOpenRoundSurvives) {
  v1::BeginCheckpointResponse round = Begin(10);
  WriteFiles(round.partial_dir(), "in flight");
  std::string link = tmp_.path() + "/runs-link";
  fs::create_directory_symlink(save_dir_, link);
  for (const std::string& spelling : {link, save_dir_ + "/", link + "/"}) {
    auto other = coord_->SubmitRun(testing::MakeSpec("ckpt", spelling, 1, 2));
    EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists) << spelling << ": " << other.status();
    EXPECT_NE(other.status().message().find(run_), std::string::npos) << other.status();
  }
  auto dotted = coord_->SubmitRun(testing::MakeSpec("ckpt", save_dir_ + "/.", 1, 2));
  EXPECT_EQ(dotted.status().code(), absl::StatusCode::kInvalidArgument) << dotted.status();
  EXPECT_TRUE(fs::is_directory(round.partial_dir()));  // no submit cleaned up the live round
}

TEST_F(CheckpointRoundTest, ACheckpointsDirSwappedForALinkToAnotherExperimentIsNotTouched) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "mine"));
  // Another experiment with checkpoints retention would delete if it followed the link.
  std::string victim = tmp_.Sub("victim/checkpoints");
  for (int step : {1, 2, 3}) fs::create_directories(victim + "/step-" + std::to_string(step));
  fs::create_directory_symlink("step-3", victim + "/latest");
  fs::rename(ckpt_dir(), save_dir_ + "/ckpt/checkpoints.real");
  fs::create_directory_symlink(victim, ckpt_dir());
  Reply<v1::BeginCheckpointResponse> b0, b1;
  v1::BeginCheckpointRequest req;
  req.set_run_id(run_);
  req.set_generation(0);
  req.set_step(20);
  req.set_rank(0);
  coord_->checkpoints().Begin(req, b0.pending());
  req.set_rank(1);
  coord_->checkpoints().Begin(req, b1.pending());
  ASSERT_TRUE(b0.WaitFor() && b1.WaitFor());
  EXPECT_EQ(b0.value.status().code(), absl::StatusCode::kAborted) << b0.value.status();
  EXPECT_NE(b0.value.status().message().find("symbolic link"), std::string::npos) << b0.value.status();
  for (int step : {1, 2, 3}) EXPECT_TRUE(fs::is_directory(victim + "/step-" + std::to_string(step)));
  EXPECT_EQ(fs::read_symlink(victim + "/latest").string(), "step-3");
  for (const auto& e : fs::directory_iterator(victim)) {
    EXPECT_EQ(e.path().filename().string().find("partial"), std::string::npos) << e.path();
  }
}

// checkpoints/ swapped for a link between a round's begin and its commit: the round wrote through
// the directory it held, which the reported path no longer reaches, so nothing is published.
TEST_F(CheckpointRoundTest, ACheckpointsDirSwappedDuringARoundAbortsItsCommit) {
  ASSERT_NO_FATAL_FAILURE(CommitStep(10, "mine"));
  v1::BeginCheckpointResponse round = Begin(20);
  v1::Manifest m = WriteFiles(round.partial_dir(), "at-20");
  std::string elsewhere = tmp_.Sub("elsewhere");
  fs::rename(ckpt_dir(), save_dir_ + "/ckpt/checkpoints.moved");
  fs::create_directory_symlink(elsewhere, ckpt_dir());
  Reply<v1::CommitCheckpointResponse> c0, c1;
  Commit(1, round, nullptr, &c1);
  Commit(0, round, &m, &c0);
  ASSERT_TRUE(c0.WaitFor() && c1.WaitFor());
  EXPECT_EQ(c0.value.status().code(), absl::StatusCode::kAborted) << c0.value.status();
  EXPECT_NE(c0.value.status().message().find("moved, removed or replaced"), std::string::npos) << c0.value.status();
  EXPECT_EQ(coord_->checkpoints().Latest(run_)->step(), 10);
  EXPECT_TRUE(fs::is_empty(elsewhere));
}

// A rank whose loss went NaN is scraped as the exposition format spells it (prometheus-cpp 1.0's
// serializer prints "Nan"), over dtcoord's own /metrics handler.
TEST_F(CoordinatorTest, PrometheusServesANaNLossAsNaN) {
  ExporterOptions options;
  options.listen = "127.0.0.1:0";
  auto exporter = PrometheusExporter::Start(options, coord_.get());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  std::string run_id = Submit(1, 1, 0, "nan");
  RegisterAll(run_id, 1, 1);
  absl::StatusOr<v1::Run> run = coord_->GetRun(run_id);
  ASSERT_TRUE(run.ok());
  v1::MetricBatch batch;
  batch.set_run_id(run_id);
  batch.set_rank(0);
  v1::MetricPoint* p = batch.add_points();
  p->set_step(7);
  (*p->mutable_values())["loss"] = std::nan("");
  (*exporter)->OnMetrics(*run, batch);
  testing::HttpResponse scrape = testing::Http("GET", absl::StrCat("http://", (*exporter)->address(), "/metrics"));
  ASSERT_EQ(scrape.status, 200) << scrape.error;
  EXPECT_NE(scrape.Header("content-type").find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(scrape.body.find(
                absl::StrCat("dt_train_loss{experiment=\"nan\",node=\"n1\",rank=\"0\",run=\"", run_id, "\"} NaN\n")),
            std::string::npos)
      << scrape.body.substr(0, 2000);
  EXPECT_EQ(scrape.body.find(" Nan\n"), std::string::npos);
  EXPECT_NE(scrape.body.find("dt_coordinator_runs{state=\"RUNNING\"} 1\n"), std::string::npos);  // the census too
  // Only sample values change: a comment or label that says Nan is left alone.
  EXPECT_EQ(ExpositionText("# HELP x says Nan\nx{a=\"b Nan\"} Nan\ny 1\n"),
            "# HELP x says Nan\nx{a=\"b Nan\"} NaN\ny 1\n");
}

#ifdef DT_CHECK_LOCK_RULE
// Debug and sanitizer builds abort on a reply completed under a run's lock.
TEST(LockRuleTest, AReplyCompletedUnderARunLockAborts) {
  RunMutex mu;
  auto reply = MakePending<Unit>([](absl::StatusOr<Unit>) {});
  EXPECT_DEATH(
      {
        RunMutexLock lock(&mu);
        reply->Complete(Unit{});
      },
      "a reply was completed while this thread holds 1 run lock");
  { RunMutexLock lock(&mu); }
  EXPECT_TRUE(reply->Complete(Unit{}));  // after the lock is released
}
#endif

// The lock rule's proof: one run's save dir stalls (a file server that stopped answering) while
// its submission prepares a directory and its checkpoint round makes one. Every other run's
// heartbeats, barriers and submissions go on at full speed, and so do the stalled run's own
// heartbeats: no lock is held across file work.
TEST_F(CoordinatorTest, AStalledSaveDirSlowsNoOtherRunAndNoOtherCall) {
  std::string busy = Submit(1, 2, 0, "busy");
  auto busy_ranks = RegisterAll(busy, 1, 2);
  std::string slow_dir = tmp_.Sub("stalled-save-dir");
  auto slow = coord_->SubmitRun(testing::MakeSpec("slow", slow_dir, 1, 2));
  ASSERT_TRUE(slow.ok()) << slow.status();
  auto slow_ranks = RegisterAll(slow->run_id(), 1, 2);

  stall_.Arm(slow_dir + "/");
  absl::Cleanup release = [&] { stall_.Release(); };
  Reply<v1::BeginCheckpointResponse> begin0, begin1;
  for (int r = 0; r < 2; ++r) {
    v1::BeginCheckpointRequest req;
    req.set_run_id(slow->run_id());
    req.set_generation(0);
    req.set_rank(r);
    req.set_step(5);
    coord_->checkpoints().Begin(req, r == 0 ? begin0.pending() : begin1.pending());
  }
  absl::Notification stalled_submit_done;
  absl::StatusOr<v1::SubmitRunResponse> stalled_submit;
  std::thread submitter([&] {
    stalled_submit = coord_->SubmitRun(testing::MakeSpec("slow-too", slow_dir, 1, 1));
    stalled_submit_done.Notify();
  });
  absl::Cleanup join = [&] {
    stall_.Release();
    submitter.join();
  };
  while (stall_.stalled() < 2) absl::SleepFor(absl::Milliseconds(1));  // both are inside the file work

  std::vector<double> ms;
  auto timed = [&](auto&& call) {
    absl::Time start = absl::Now();
    call();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  };
  for (int i = 1; i <= 100; ++i) {
    timed([&] { ASSERT_TRUE(Beat(busy, busy_ranks[i % 2], i).ok()); });
    timed([&] { ASSERT_TRUE(Beat(slow->run_id(), slow_ranks[i % 2], 1).ok()); });
  }
  for (int i = 0; i < 50; ++i) {
    timed([&] {
      Reply<v1::BarrierResponse> b0, b1;
      v1::BarrierRequest req = BarrierRequest(busy, "sync", 60'000);
      req.set_rank(0);
      coord_->store_barriers().Barrier(req, b0.pending());
      req.set_rank(1);
      coord_->store_barriers().Barrier(req, b1.pending());
      ASSERT_TRUE(b0.WaitFor() && b1.WaitFor());
      ASSERT_TRUE(b0.value.ok()) << b0.value.status();
    });
  }
  timed([&] { ASSERT_TRUE(coord_->SubmitRun(testing::MakeSpec("elsewhere", save_dir_, 1, 1)).ok()); });
  timed([&] { ASSERT_TRUE(coord_->ListRuns(0, {}).ok()); });
  std::sort(ms.begin(), ms.end());
  double p99 = ms[ms.size() * 99 / 100];
  EXPECT_LT(p99, 50.0) << "p99 of " << ms.size() << " calls; the slowest took " << ms.back() << " ms";
  // The stall lasted through every measured call: the stalled work is still waiting.
  EXPECT_FALSE(stalled_submit_done.HasBeenNotified());
  EXPECT_FALSE(begin0.arrived() || begin1.arrived());

  stall_.Release();
  ASSERT_TRUE(stalled_submit_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(stalled_submit.ok()) << stalled_submit.status();
  ASSERT_TRUE(begin0.WaitFor() && begin1.WaitFor());
  ASSERT_TRUE(begin0.value.ok()) << begin0.value.status();
  EXPECT_TRUE(fs::is_directory(begin0.value->partial_dir()));
  EXPECT_EQ(begin0.value->round_id(), begin1.value->round_id());
}

// ---- Persistence ----------------------------------------------------------------------------

TEST_F(CoordinatorTest, ARestartedCoordinatorKnowsEveryRunAndKeepsRunningOnes) {
  std::string done = Submit(1, 1, 0, "finished");
  ASSERT_TRUE(coord_->CancelRun(done, "").ok());
  std::string run = Submit(1, 2, 0, "running");
  auto ranks = RegisterAll(run, 1, 2);
  Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(run, ranks[0], 5).ok());
  ASSERT_TRUE(Beat(run, ranks[1], 5).ok());
  Advance(absl::Seconds(3));  // the progress flush
  Reopen();
  auto list = coord_->ListRuns(0, {});
  ASSERT_EQ(list->runs.size(), 2u);
  EXPECT_EQ(coord_->GetRun(done)->state(), v1::CANCELLED);
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->state(), v1::RUNNING);
  EXPECT_EQ(status->step(), 5);
  // Its trainers carry on: heartbeats are accepted...
  Advance(absl::Seconds(20));
  auto hb = Beat(run, ranks[0], 6);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->directive(), v1::HeartbeatResponse::CONTINUE);
  // ...and one that never comes back is declared dead after the heartbeat timeout.
  for (int i = 0; i < 10; ++i) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(run, ranks[0], 6).ok());
  }
  EXPECT_EQ(coord_->GetRun(run)->state(), v1::FAILED);
  EXPECT_EQ(coord_->GetRun(run)->reason().rank(), 1);
}

}  // namespace
}  // namespace dt

namespace dt {
namespace {

// A rank's answer to a capture: its main thread in `function` (a Python frame of train.py).
v1::ReportStacksRequest StacksOf(const std::string& run, const v1::RegisterResponse& a, const std::string& capture,
                                 const std::string& function) {
  v1::ReportStacksRequest req;
  req.set_run_id(run);
  req.set_rank(a.rank());
  req.set_generation(a.generation());
  req.set_incarnation("n" + std::to_string(a.node_rank() + 1) + "-" + std::to_string(a.local_rank()));
  req.set_capture_id(capture);
  v1::ThreadStack* t = req.mutable_stacks()->add_processes()->add_threads();
  req.mutable_stacks()->mutable_processes(0)->set_kind("python");
  t->set_main(true);
  v1::StackFrame* f = t->add_frames();
  f->set_function(function);
  f->set_file("/x/train.py");
  f->set_line(function == "load_batch" ? 9 : 20);
  return req;
}

class StacksTest : public CoordinatorTest {
 protected:
  // Steps 1..3, then heartbeats at step 3 until the hang timeout passes: the capture's id.
  std::string HangUntilCaptured(const std::string& run, const std::vector<v1::RegisterResponse>& ranks) {
    for (int step = 1; step <= 3; ++step) {
      Advance(absl::Seconds(2));
      for (const auto& a : ranks) EXPECT_TRUE(Beat(run, a, step).ok());
    }
    for (int i = 0; i < 400; ++i) {
      Advance(absl::Seconds(2));
      for (const auto& a : ranks) {
        absl::StatusOr<v1::HeartbeatResponse> b = Beat(run, a, 3);
        EXPECT_TRUE(b.ok()) << b.status();
        if (b.ok() && !b->capture_id().empty()) return b->capture_id();
      }
    }
    ADD_FAILURE() << "no capture was asked for";
    return "";
  }
};

TEST_F(StacksTest, AHangIsCapturedBeforeTheGenerationFailsAndTheVerdictNamesTheOddRank) {
  std::string run = Submit(1, 2, /*max_restarts=*/1);
  auto ranks = RegisterAll(run, 1, 2, /*captures=*/true);
  std::string capture = HangUntilCaptured(run, ranks);
  // Until the ranks answer, the generation lives: the processes the evidence comes from do too.
  EXPECT_EQ(State(run), v1::RUNNING);
  ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[0], capture, "all_reduce")).ok());
  EXPECT_EQ(State(run), v1::RUNNING);
  ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[1], capture, "load_batch")).ok());
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::RESTARTING);
  EXPECT_EQ(r.reason().kind(), v1::Failure::HANG);
  EXPECT_EQ(r.reason().rank(), 1);
  ASSERT_EQ(r.reason().verdict().odd_ranks_size(), 1);
  EXPECT_EQ(r.reason().verdict().odd_ranks(0), 1);
  EXPECT_NE(r.reason().message().find("load_batch"), std::string::npos) << r.reason().message();
  // A late answer is refused, naming the capture.
  EXPECT_EQ(coord_->stacks().Report(StacksOf(run, ranks[1], capture, "x")).status().code(), absl::StatusCode::kAborted);
  // The capture is kept: in GetStacks and in the experiment directory.
  coord_->AwaitFileWork();
  v1::GetStacksRequest get;
  get.set_run_id(run);
  absl::StatusOr<v1::GetStacksResponse> kept = coord_->stacks().Get(get);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->captures_size(), 1);
  EXPECT_EQ(kept->captures(0).capture_id(), capture);
  EXPECT_FALSE(kept->captures(0).live());
  EXPECT_EQ(kept->captures(0).ranks_size(), 2);
  std::string verdict = testing::Slurp(JoinPath(r.exp_dir(), "hangs/gen-0/verdict.txt"));
  EXPECT_NE(verdict.find("odd group: rank 1"), std::string::npos) << verdict;
  EXPECT_NE(testing::Slurp(JoinPath(r.exp_dir(), "hangs/gen-0/rank-1.txt")).find("load_batch"), std::string::npos);
}

TEST_F(StacksTest, RanksThatDoNotAnswerAreNamedAtTheDeadline) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2, /*captures=*/true);
  std::string capture = HangUntilCaptured(run, ranks);
  ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[0], capture, "all_reduce")).ok());
  Advance(coord_->stacks().Window() + absl::Seconds(1));
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::FAILED);
  EXPECT_EQ(r.reason().kind(), v1::Failure::HANG);
  ASSERT_EQ(r.reason().verdict().missing_ranks_size(), 1);
  EXPECT_EQ(r.reason().verdict().missing_ranks(0), 1);
  EXPECT_NE(r.reason().message().find("No stacks from rank 1"), std::string::npos) << r.reason().message();
}

TEST_F(StacksTest, RanksThatDoNotCaptureFailAtOnceAsBefore) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2, /*captures=*/false);
  for (int i = 0; i < 310; ++i) {
    Advance(absl::Seconds(2));
    for (const auto& a : ranks) {
      absl::StatusOr<v1::HeartbeatResponse> b = Beat(run, a, 0);
      if (b.ok()) {
        EXPECT_EQ(b->capture_id(), "");
      }
    }
  }
  EXPECT_EQ(coord_->GetRun(run)->reason().kind(), v1::Failure::HANG);
  EXPECT_FALSE(coord_->GetRun(run)->reason().has_verdict());
}

TEST_F(StacksTest, TheSameHangTwiceEndsTheRunHungRepeatedly) {
  std::string run = Submit(1, 2, /*max_restarts=*/5);
  for (int generation = 0; generation < 2; ++generation) {
    auto ranks = RegisterAll(run, 1, 2, /*captures=*/true);
    std::string capture = HangUntilCaptured(run, ranks);
    ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[0], capture, "all_reduce")).ok());
    ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[1], capture, "load_batch")).ok());
  }
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::FAILED);
  EXPECT_EQ(r.restarts(), 1);  // one restart, not the whole budget
  EXPECT_EQ(r.reason().kind(), v1::Failure::HUNG_REPEATEDLY);
  EXPECT_NE(r.reason().message().find("hung the way generation 0 did"), std::string::npos) << r.reason().message();
}

TEST_F(StacksTest, TheSameExceptionBeforeTheFirstStepTwiceEndsTheRun) {
  std::string run = Submit(1, 2, /*max_restarts=*/5);
  for (int generation = 0; generation < 2; ++generation) {
    auto ranks = RegisterAll(run, 1, 2);
    v1::ReportErrorRequest err;
    err.set_run_id(run);
    err.set_generation(generation);
    err.set_rank(1);
    err.set_message("No module named 'torch'");
    err.set_exception_type("ModuleNotFoundError");
    ASSERT_TRUE(coord_->health().ReportError(err).ok());
  }
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::FAILED);
  EXPECT_EQ(r.restarts(), 1);
  EXPECT_TRUE(r.reason().fatal());
  EXPECT_TRUE(r.reason().before_first_step());
  EXPECT_NE(r.reason().message().find("ended generation 0 before its first step too"), std::string::npos)
      << r.reason().message();
}

TEST_F(StacksTest, AnExceptionAfterTrainingIsRestartedAsBefore) {
  std::string run = Submit(1, 2, /*max_restarts=*/5);
  for (int generation = 0; generation < 2; ++generation) {
    auto ranks = RegisterAll(run, 1, 2);
    Advance(absl::Seconds(2));
    for (const auto& a : ranks) ASSERT_TRUE(Beat(run, a, 5).ok());
    v1::ReportErrorRequest err;
    err.set_run_id(run);
    err.set_generation(generation);
    err.set_rank(1);
    err.set_message("loss is nan");
    err.set_exception_type("ValueError");
    ASSERT_TRUE(coord_->health().ReportError(err).ok());
  }
  EXPECT_EQ(State(run), v1::RESTARTING);
  EXPECT_FALSE(coord_->GetRun(run)->reason().fatal());
}

TEST_F(StacksTest, ALiveCaptureLeavesTheRunTrainingAndIsKept) {
  std::string run = Submit(1, 2);
  auto ranks = RegisterAll(run, 1, 2, /*captures=*/true);
  Reply<v1::StackCapture> live;
  v1::CaptureStacksRequest req;
  req.set_run_id(run);
  coord_->stacks().Capture(req, live.pending());
  EXPECT_FALSE(live.arrived());
  std::string capture = Beat(run, ranks[0], 1)->capture_id();
  ASSERT_FALSE(capture.empty());
  EXPECT_EQ(Beat(run, ranks[1], 1)->capture_id(), capture);
  // An answer to a capture that does not exist is refused, naming it.
  absl::StatusOr<v1::ReportStacksResponse> stray = coord_->stacks().Report(StacksOf(run, ranks[0], "cap-other", "f"));
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(stray.status().message().find("cap-other"), std::string::npos);
  ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[0], capture, "train_step")).ok());
  ASSERT_TRUE(coord_->stacks().Report(StacksOf(run, ranks[1], capture, "train_step")).ok());
  ASSERT_TRUE(live.arrived());
  ASSERT_TRUE(live.value.ok()) << live.value.status();
  EXPECT_TRUE(live.value->live());
  EXPECT_EQ(live.value->ranks_size(), 2);
  EXPECT_EQ(live.value->verdict().groups_size(), 1);
  EXPECT_EQ(State(run), v1::RUNNING);
  EXPECT_EQ(Beat(run, ranks[0], 2)->capture_id(), "");  // answered: not asked again
  // An ended run has nothing to capture; asking says where its captures are.
  ASSERT_TRUE(coord_->CancelRun(run, "done").ok());
  Reply<v1::StackCapture> ended;
  coord_->stacks().Capture(req, ended.pending());
  ASSERT_TRUE(ended.arrived());
  EXPECT_EQ(ended.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ended.value.status().message().find("GetStacks"), std::string::npos);
  v1::GetStacksRequest get;
  get.set_run_id(run);
  EXPECT_EQ(coord_->stacks().Get(get)->captures_size(), 1);
  get.set_generation(7);
  EXPECT_EQ(coord_->stacks().Get(get)->captures_size(), 0);
  get.set_generation(-1);
  EXPECT_EQ(coord_->stacks().Get(get).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StacksTest, AnIdleRankIsAHangOnceTheIdleTimeoutPasses) {
  v1::RunSpec spec = testing::MakeSpec("idle", save_dir_, 1, 2);
  spec.add_exec_command("python3");
  spec.set_idle_timeout_ms(60'000);
  auto submitted = coord_->SubmitRun(spec);
  ASSERT_TRUE(submitted.ok());
  std::string run = submitted->run_id();
  auto ranks = RegisterAll(run, 1, 2);
  auto idle_beat = [&](const v1::RegisterResponse& a, absl::Duration idle) {
    v1::HeartbeatRequest req;
    req.set_run_id(run);
    req.set_rank(a.rank());
    req.set_generation(a.generation());
    req.set_incarnation("n1-" + std::to_string(a.local_rank()));
    req.set_idle_ms(absl::ToInt64Milliseconds(idle));
    return coord_->health().Heartbeat(req);
  };
  for (int s = 2; s <= 58; s += 2) {
    Advance(absl::Seconds(2));
    ASSERT_TRUE(idle_beat(ranks[0], absl::ZeroDuration()).ok());
    ASSERT_TRUE(idle_beat(ranks[1], absl::Seconds(s)).ok());
  }
  EXPECT_EQ(State(run), v1::RUNNING);
  for (int s = 60; s <= 64; s += 2) {
    Advance(absl::Seconds(2));
    (void)idle_beat(ranks[0], absl::ZeroDuration());
    (void)idle_beat(ranks[1], absl::Seconds(s));
  }
  v1::Run r = *coord_->GetRun(run);
  EXPECT_EQ(r.state(), v1::FAILED);
  EXPECT_EQ(r.reason().kind(), v1::Failure::HANG);
  EXPECT_NE(r.reason().message().find("rank 1: no output, no CPU"), std::string::npos) << r.reason().message();
  // The run's own limit is checked.
  spec.set_experiment_name("idle-bad");
  spec.set_idle_timeout_ms(-1);
  EXPECT_EQ(coord_->SubmitRun(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dt
