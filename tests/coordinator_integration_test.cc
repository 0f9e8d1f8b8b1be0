// The coordinator over real gRPC on loopback: concurrent rendezvous, barriers that fail with
// names, dead ranks, checkpoint writers killed mid-round, auth, the store session, watch,
// health and reflection, and a kill -9 restart of the dtcoord binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include <grpcpp/generic/generic_stub.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "client/agent.h"
#include "client/metrics_reporter.h"
#include "client/node_heartbeats.h"
#include "client/node_relay.h"
#include "client/store_session.h"
#include "common/fs.h"
#include "common/limits.h"
#include "common/proto_time.h"
#include "common/subprocess.h"
#include "coordinator/metric_pipeline.h"
#include "tests/test_util.h"

namespace dt {
namespace {

namespace fs = std::filesystem;

EmbeddedOptions FastTimeouts() {
  EmbeddedOptions o;
  o.timeouts.heartbeat_interval = absl::Milliseconds(100);
  o.timeouts.heartbeat_timeout = absl::Seconds(1);
  o.timeouts.hang_timeout = absl::Minutes(5);
  o.timeouts.rendezvous_timeout = absl::Seconds(30);
  o.health_check_period = absl::Milliseconds(25);
  return o;
}

class IntegrationTest : public ::testing::Test {
 protected:
  // Added to the coordinator by the tests that hold deliveries; declared first, so it outlives it.
  testing::HeldMetricObserver held_observer_;
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  EmbeddedCoordinator coord_{tmp_.Sub("state"), FastTimeouts()};
  std::shared_ptr<CoordinatorClient> admin_ = coord_.AdminClient();

  // The command line of a sim_rank joining `run` on node n1 in `slot`; callers add its options.
  std::vector<std::string> SimRankArgs(const v1::SubmitRunResponse& run, int slot) {
    return {testing::BinaryPath("sim_rank"),
            "--coordinator",
            coord_.address(),
            "--token",
            run.run_token(),
            "--run",
            run.run_id(),
            "--node",
            "n1",
            "--slot",
            std::to_string(slot)};
  }

  v1::SubmitRunResponse Submit(const std::string& name, int nodes, int ppn, int max_restarts = 0) {
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec(name, save_dir_, nodes, ppn, max_restarts);
    auto r = Call(*admin_, &v1::RunService::Stub::SubmitRun, admin_->runs(), req, absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }

  v1::Run GetRun(const std::string& run) {
    v1::GetRunRequest req;
    req.set_run_id(run);
    return *Call(*admin_, &v1::RunService::Stub::GetRun, admin_->runs(), req, absl::Seconds(10));
  }

  std::unique_ptr<Agent> MakeAgent(const v1::SubmitRunResponse& run, const std::string& node, int slot) {
    AgentOptions o;
    o.run_id = run.run_id();
    o.node = node;
    o.local_slot = slot;
    o.host = "host-" + node;
    o.pid = 4242;
    return std::make_unique<Agent>(coord_.Client(run.run_token()), o);
  }

  // Rank 0's batch of one point: `loss` at `step`.
  static v1::MetricBatch LossBatch(const std::string& run_id, int64_t step, double loss) {
    v1::MetricBatch batch;
    batch.set_run_id(run_id);
    batch.set_rank(0);
    v1::MetricPoint* p = batch.add_points();
    p->set_step(step);
    (*p->mutable_values())["loss"] = loss;
    return batch;
  }

  // One ReportMetrics stream carrying `batch`; its final status.
  static grpc::Status ReportBatch(CoordinatorClient& client, const v1::MetricBatch& batch, absl::Duration timeout) {
    auto ctx = client.Context(timeout);
    v1::ReportMetricsResponse resp;
    auto writer = client.metrics().ReportMetrics(ctx.get(), &resp);
    writer->Write(batch);
    writer->WritesDone();
    return writer->Finish();
  }

  // Registers nodes × ppn agents concurrently; returns them ordered by rank.
  std::vector<std::unique_ptr<Agent>> RegisterAll(const v1::SubmitRunResponse& run, int nodes, int ppn) {
    std::vector<std::unique_ptr<Agent>> agents;
    for (int n = 0; n < nodes; ++n) {
      for (int s = 0; s < ppn; ++s) agents.push_back(MakeAgent(run, "node" + std::to_string(n), s));
    }
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (auto& a : agents) {
      threads.emplace_back([&a, &failures] {
        if (!a->Register(absl::Seconds(20)).ok()) ++failures;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    std::sort(agents.begin(), agents.end(), [](const auto& x, const auto& y) { return x->rank() < y->rank(); });
    return agents;
  }
};

TEST_F(IntegrationTest, SixtyFourConcurrentRanksGetAHostContiguousPermutation) {
  auto run = Submit("sixty-four", 8, 8);
  std::vector<std::unique_ptr<Agent>> agents;
  // Arrival order scrambled across nodes: slot-major.
  for (int s = 0; s < 8; ++s) {
    for (int n = 7; n >= 0; --n) agents.push_back(MakeAgent(run, "node" + std::to_string(n), s));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = agents[i]->Register(absl::Seconds(30)).status(); });
  }
  for (auto& t : threads) t.join();
  std::set<int> ranks;
  for (size_t i = 0; i < agents.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i];
    const v1::RegisterResponse& a = agents[i]->assignment();
    ranks.insert(a.rank());
    int node = (int)(7 - (i % 8));
    int slot = (int)(i / 8);
    EXPECT_EQ(a.rank(), node * 8 + slot) << "node" << node << "/" << slot;
    EXPECT_EQ(a.node_rank(), node);
    EXPECT_EQ(a.local_rank(), slot);
    EXPECT_EQ(a.world_size(), 64);
    EXPECT_EQ(a.local_world_size(), 8);
  }
  EXPECT_EQ(ranks.size(), 64u);
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), 63);
  EXPECT_EQ(GetRun(run.run_id()).state(), v1::RUNNING);
}

TEST_F(IntegrationTest, BarrierWithAMissingRankTimesOutAndNamesIt) {
  auto run = Submit("barrier-timeout", 1, 3);
  auto agents = RegisterAll(run, 1, 3);
  absl::Status s0, s1;
  std::thread t0([&] { s0 = agents[0]->Barrier("data-ready", absl::Milliseconds(500)); });
  std::thread t1([&] { s1 = agents[1]->Barrier("data-ready", absl::Milliseconds(500)); });
  t0.join();
  t1.join();
  for (const absl::Status& s : {s0, s1}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("missing 1: rank 2 (node node0, host host-node0)"), std::string::npos) << s;
    EXPECT_NE(s.message().find("\"data-ready\""), std::string::npos) << s;
  }
}

// A node's last arrival carries the arrivals its node relay held back, so one message counts the
// node's ranks; a carry the coordinator cannot trust is refused and counts none of them.
TEST_F(IntegrationTest, ANodesLastArrivalCarriesItsNodesHeldBackArrivals) {
  auto run = Submit("carried", 2, 3);
  auto agents = RegisterAll(run, 2, 3);  // ranks 0-2 on node0, 3-5 on node1
  std::vector<std::unique_ptr<StoreSession>> sessions;
  for (int r = 0; r < 6; ++r) {
    auto s = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), agents[r]->generation(), r);
    ASSERT_TRUE(s.ok()) << s.status();
    sessions.push_back(std::move(*s));
  }
  // Each node's holder arrives and waits for its answer.
  absl::StatusOr<uint64_t> held0, held3;
  std::thread t0([&] { held0 = sessions[0]->Barrier("sync", 1, absl::Seconds(20)); });
  std::thread t3([&] { held3 = sessions[3]->Barrier("sync", 1, absl::Seconds(20)); });
  // A failed assertion below must not leave the threads unjoined (std::terminate hides it).
  absl::Cleanup join = [&] {
    if (t0.joinable()) t0.join();
    if (t3.joinable()) t3.join();
  };
  auto carry = [](std::vector<int32_t> ranks, bool relay_member = true, uint64_t sequence = 1) {
    v1::StoreRequest r;
    r.mutable_barrier()->set_name("sync");
    r.mutable_barrier()->set_sequence(sequence);
    r.mutable_barrier()->set_timeout_ms(20000);
    r.mutable_barrier()->set_relay_member(relay_member);
    r.mutable_barrier()->mutable_relayed_ranks()->Add(ranks.begin(), ranks.end());
    return r;
  };
  const std::vector<std::pair<v1::StoreRequest, std::string>> refused = {
      {carry({1}), "rank 4 on node \"node1\" cannot carry the arrival of rank 1 on node \"node0\""},
      {carry({4}), "rank 4 cannot relay its own arrival"},
      {carry({5, 5}), "relayed rank 5 is repeated"},
      {carry({6}), "relayed rank 6 is outside 0..5"},
      {carry({5}, false), "relayed_ranks come only with a relay_member arrival"},
      // Without a sequence a carried arrival of rank 3, which waits for its answer, would replace it.
      {carry({3}, true, 0), "need the instance's sequence (1 or more), not 0"},
  };
  for (const auto& [request, message] : refused) {
    absl::StatusOr<v1::StoreResponse> answer = sessions[4]->Call(request);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << message;
    EXPECT_NE(answer->status().message().find(message), std::string::npos) << answer->status().message();
  }
  // A refused carry sent the way a relay sends it (nobody waits for its answer) is not mistaken
  // for a failed set: the session's later calls succeed.
  ASSERT_TRUE(sessions[4]->ArriveAsRelayMember("sync", 1, absl::Seconds(20), {1}).ok());
  ASSERT_TRUE(sessions[4]->Set("after-refusal", "1").ok());
  absl::StatusOr<std::string> after = sessions[4]->Get("after-refusal", absl::Seconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  // Ranks 0 and 3 arrived (from their threads, perhaps only now), and rank 4 itself (its own
  // arrival is counted): nobody it tried to carry. Every refused request was answered above.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        v1::Run now = GetRun(run.run_id());
        return now.open_barriers_size() == 1 && now.open_barriers(0).arrived() >= 3;
      },
      absl::Seconds(10)));
  v1::OpenBarrier open = GetRun(run.run_id()).open_barriers(0);
  EXPECT_EQ(open.arrived(), 3);
  EXPECT_EQ(std::vector<int>(open.missing_ranks().begin(), open.missing_ranks().end()), (std::vector<int>{1, 2, 5}));

  // Node 0's last arrival carries rank 1, and rank 0, which arrived itself and keeps its answer;
  // node 1's carries rank 5. Everybody is counted: the holders are released.
  ASSERT_TRUE(sessions[2]->ArriveAsRelayMember("sync", 1, absl::Seconds(20), {1, 0}).ok());
  ASSERT_TRUE(sessions[4]->ArriveAsRelayMember("sync", 1, absl::Seconds(20), {5}).ok());
  t0.join();
  t3.join();
  ASSERT_TRUE(held0.ok()) << held0.status();
  ASSERT_TRUE(held3.ok()) << held3.status();
  EXPECT_EQ(*held0, 1u);
  EXPECT_EQ(*held3, 1u);
}

TEST_F(IntegrationTest, AHeldBackArrivalWhoseCarrierNeverSendsItIsSentByItsOwnRank) {
  auto run = Submit("stranded", 1, 3);
  auto agents = RegisterAll(run, 1, 3);  // ranks 0-2 on node0
  for (auto& a : agents) a->StartHeartbeats([](const std::string&) {});
  int64_t generation = agents[0]->generation();
  // Ranks 0 and 2 use the node's relay by hand: 0 holds the instance; 2, the node's last arrival,
  // takes rank 1's held-back arrival to carry and dies before sending anything.
  auto relay0 = NodeRelay::Open(run.run_id(), generation, "node0", 3);
  auto relay2 = NodeRelay::Open(run.run_id(), generation, "node0", 3);
  ASSERT_TRUE(relay0.ok() && relay2.ok());
  NodeRelay::Ticket holder = (*relay0)->Arrive("sync", 1, 0);
  ASSERT_EQ(holder.role, NodeRelay::Role::kHolder);
  auto session0 = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), generation, 0);
  ASSERT_TRUE(session0.ok()) << session0.status();
  absl::StatusOr<uint64_t> held;
  std::thread t0([&] { held = (*session0)->Barrier("sync", 1, absl::Seconds(20)); });
  absl::Status s1;
  std::thread t1([&] { s1 = agents[1]->Barrier("sync", absl::Seconds(20)); });
  absl::Cleanup join = [&] {
    if (t0.joinable()) t0.join();
    if (t1.joinable()) t1.join();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return (*relay0)->ArrivedAt("sync", 1) == 2; }, absl::Seconds(10)))
      << "rank 1 never arrived at its node's relay";
  NodeRelay::Ticket carrier = (*relay2)->Arrive("sync", 1, 2);
  ASSERT_EQ(carrier.carry, std::vector<int32_t>{1}) << "rank 1 was held back for rank 2 to carry";

  // Rank 1 hears nothing for a second and sends its own arrival: the barrier waits for rank 2
  // alone, and says so, instead of naming a rank that is there.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        v1::Run now = GetRun(run.run_id());
        return now.open_barriers_size() == 1 && now.open_barriers(0).arrived() == 2;
      },
      absl::Seconds(10)));
  v1::OpenBarrier open = GetRun(run.run_id()).open_barriers(0);
  EXPECT_EQ(std::vector<int>(open.missing_ranks().begin(), open.missing_ranks().end()), std::vector<int>{2});

  // Rank 2 comes back and arrives itself: released; the holder tells rank 1.
  auto session2 = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), generation, 2);
  ASSERT_TRUE(session2.ok()) << session2.status();
  ASSERT_TRUE((*session2)->ArriveAsRelayMember("sync", 1, absl::Seconds(20)).ok());
  t0.join();
  ASSERT_TRUE(held.ok()) << held.status();
  (*relay0)->Publish(holder, RelayOutcome{absl::OkStatus(), *held});
  t1.join();
  EXPECT_TRUE(s1.ok()) << s1;
}

TEST_F(IntegrationTest, ACarriedArrivalBeforeTheRendezvousIsRefusedAndTheCoordinatorLivesOn) {
  auto run = Submit("carried-early", 1, 2);
  // Nobody registered: the generation has no ranks, so no node to check a carry against.
  auto session = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), 0, 0);
  ASSERT_TRUE(session.ok()) << session.status();
  v1::StoreRequest r;
  r.mutable_barrier()->set_name("sync");
  r.mutable_barrier()->set_sequence(1);
  r.mutable_barrier()->set_timeout_ms(20000);
  r.mutable_barrier()->set_relay_member(true);
  r.mutable_barrier()->add_relayed_ranks(1);
  absl::StatusOr<v1::StoreResponse> answer = (*session)->Call(r);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->status().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(answer->status().message().find("has not completed its rendezvous"), std::string::npos)
      << answer->status().message();
  // The coordinator still answers, and the run forms as usual.
  EXPECT_EQ(GetRun(run.run_id()).state(), v1::PENDING);
  auto agents = RegisterAll(run, 1, 2);
  EXPECT_EQ(GetRun(run.run_id()).state(), v1::RUNNING);
}

TEST_F(IntegrationTest, ARankThatStopsHeartbeatingFailsTheOthersBarrier) {
  auto run = Submit("dead-rank", 1, 3);
  auto agents = RegisterAll(run, 1, 3);
  std::vector<std::string> stop_reasons(3);
  std::vector<absl::Notification> stopped(3);
  for (int r = 0; r < 2; ++r) {  // rank 2 never heartbeats: it "died" after registering
    agents[r]->StartHeartbeats([&, r](const std::string& reason) {
      stop_reasons[r] = reason;
      stopped[r].Notify();
    });
  }
  absl::Time start = absl::Now();
  absl::Status s0, s1;
  std::thread t0([&] { s0 = agents[0]->Barrier("step-1", absl::Seconds(60)); });
  std::thread t1([&] { s1 = agents[1]->Barrier("step-1", absl::Seconds(60)); });
  t0.join();
  t1.join();
  absl::Duration took = absl::Now() - start;
  for (const absl::Status& s : {s0, s1}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s;
    EXPECT_NE(s.message().find("no heartbeat"), std::string::npos) << s;
  }
  // Well before the barrier's own minute: the heartbeat timeout (1 s) decided.
  EXPECT_LT(took, absl::Seconds(15));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stopped[r].WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_NE(stop_reasons[r].find("rank 2"), std::string::npos) << stop_reasons[r];
  }
  v1::Run status = GetRun(run.run_id());
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.reason().rank(), 2);
  EXPECT_EQ(status.reason().kind(), v1::Failure::HEARTBEAT_TIMEOUT);
}

// A node agent's stream asking for changes only: its first heartbeat is answered, then nothing
// until an answer changes. The answers come in order, so the answer read after the run's
// cancellation is the STOP only if no unchanged heartbeat before it was answered.
TEST_F(IntegrationTest, ANodeStreamAskingForChangesOnlyHearsOnlyWhatChanged) {
  auto run = Submit("changes-only", 1, 2);
  auto agents = RegisterAll(run, 1, 2);
  auto client = coord_.Client(run.run_token());
  std::unique_ptr<grpc::ClientContext> ctx = client->Context(absl::Seconds(30));
  auto stream = client->rendezvous().NodeHeartbeats(ctx.get());
  auto beat = [&](int64_t step, bool changes_only) {
    v1::NodeHeartbeatRequest m;
    m.set_run_id(run.run_id());
    m.set_answer_changes_only(changes_only);
    for (int r = 0; r < 2; ++r) {
      v1::RankHeartbeat& b = *m.add_ranks();
      b.set_rank(agents[r]->rank());
      b.set_incarnation(agents[r]->incarnation());
      b.set_step(step);
    }
    return stream->Write(m);
  };
  auto directives = [](const v1::NodeHeartbeatResponse& answer) {
    std::vector<std::string> out;
    for (const auto& rank : answer.ranks()) {
      out.push_back(rank.code() != 0 ? absl::StrCat("code ", rank.code())
                                     : v1::HeartbeatResponse::Directive_Name(rank.reply().directive()));
    }
    return absl::StrJoin(out, ",");
  };
  v1::NodeHeartbeatResponse answer;
  ASSERT_TRUE(beat(1, true));
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(directives(answer), "CONTINUE,CONTINUE");
  ASSERT_TRUE(beat(2, true) && beat(3, true));
  ASSERT_TRUE(beat(4, false));  // answered although unchanged: it did not ask for changes only
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(directives(answer), "CONTINUE,CONTINUE");
  v1::Run status = GetRun(run.run_id());
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.step(), 4) << "every heartbeat counts, answered or not";

  v1::CancelRunRequest cancel;
  cancel.set_run_id(run.run_id());
  ASSERT_TRUE(Call(*admin_, &v1::RunService::Stub::CancelRun, admin_->runs(), cancel, absl::Seconds(10)).ok());
  ASSERT_TRUE(beat(5, true));
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(directives(answer), "STOP,STOP");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// dtrun's heartbeats: one stream for the node's ranks. It alone keeps them alive past the
// heartbeat timeout, carries a stack capture to each of them, lets a rank that ended leave, and
// tells the rest to stop when the run is cancelled.
TEST_F(IntegrationTest, ANodesHeartbeatStreamKeepsItsRanksAliveCapturesTheirStacksAndStopsThem) {
  auto run = Submit("node-stream", 1, 2);
  std::vector<std::unique_ptr<Agent>> owned;
  std::vector<Agent*> agents;
  for (int s = 0; s < 2; ++s) {
    owned.push_back(MakeAgent(run, "node0", s));
    owned.back()->SetStackCapturer([s] {
      v1::RankStacks stacks;
      v1::ThreadStack& thread = *stacks.add_processes()->add_threads();
      thread.set_main(true);
      thread.add_frames()->set_function(absl::StrCat("captured_in_slot_", s));
      return stacks;
    });
    agents.push_back(owned.back().get());
  }
  ASSERT_TRUE(Agent::RegisterNode(agents, absl::Seconds(20)).ok());
  absl::Mutex mu;
  std::vector<std::string> reasons;
  absl::Notification stopped;
  const absl::Time start = absl::Now();
  NodeHeartbeats heartbeats(agents, [&](const std::string& reason) {
    absl::MutexLock lock(&mu);
    reasons.push_back(reason);
    stopped.Notify();
  });

  // Heard from well after the heartbeat timeout (1 s) of their registration: the stream's doing.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        v1::Run now = GetRun(run.run_id());
        if (now.ranks_size() != 2) return false;
        for (const v1::RankStatus& r : now.ranks()) {
          if (FromProtoTime(r.last_heartbeat()) < start + absl::Milliseconds(1500)) return false;
        }
        return true;
      },
      absl::Seconds(10)));
  EXPECT_EQ(GetRun(run.run_id()).state(), v1::RUNNING);

  v1::CaptureStacksRequest capture;
  capture.set_run_id(run.run_id());
  auto captured = Call(*admin_, &v1::StacksService::Stub::CaptureStacks, admin_->stacks(), capture, absl::Seconds(30));
  ASSERT_TRUE(captured.ok()) << captured.status();
  ASSERT_EQ(captured->ranks_size(), 2) << captured->ShortDebugString();
  for (const v1::RankStacks& rank : captured->ranks()) {
    ASSERT_EQ(rank.processes_size(), 1) << rank.ShortDebugString();
    const int slot = rank.rank() == agents[0]->rank() ? 0 : 1;
    EXPECT_EQ(rank.processes(0).threads(0).frames(0).function(), absl::StrCat("captured_in_slot_", slot));
  }

  heartbeats.Drop(agents[1]);
  ASSERT_TRUE(agents[1]->Leave(0).ok());
  v1::CancelRunRequest cancel;
  cancel.set_run_id(run.run_id());
  ASSERT_TRUE(Call(*admin_, &v1::RunService::Stub::CancelRun, admin_->runs(), cancel, absl::Seconds(10)).ok());
  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  heartbeats.Stop();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_TRUE(absl::StrContains(absl::AsciiStrToLower(reasons[0]), "cancel")) << reasons[0];
}

TEST_F(IntegrationTest, AKilledCheckpointWriterLeavesLatestUnchangedAndNoPartialDirectory) {
  auto run = Submit("writer-dies", 1, 2);
  std::string log = JoinPath(tmp_.path(), "ranks.log");
  auto spawn = [&](int slot, int64_t step, bool hang) {
    std::vector<std::string> argv = SimRankArgs(run, slot);
    argv.insert(argv.end(), {"--checkpoint-step", std::to_string(step)});
    if (hang) argv.push_back("--hang-after-partial");
    return std::make_unique<testing::Subprocess>(argv, std::map<std::string, std::string>{},
                                                 JoinPath(tmp_.path(), "rank" + std::to_string(slot) + ".log"));
  };
  std::string ckpt = save_dir_ + "/writer-dies/checkpoints";
  // Round 1 at step 10 commits normally: latest = step-10.
  {
    auto r0 = spawn(0, 10, false);
    auto r1 = spawn(1, 10, false);
    ASSERT_TRUE(testing::WaitFor([&] { return fs::exists(ckpt + "/step-10/manifest.json"); }, absl::Seconds(30)));
    ASSERT_TRUE(testing::WaitFor(
        [&] { return testing::Slurp(JoinPath(tmp_.path(), "rank1.log")).find("commit: ok") != std::string::npos; },
        absl::Seconds(30)));
    // Ending those processes fails generation 0 (no restarts allowed): submit a fresh run on the
    // same directory for round 2, which resumes from step 10.
  }
  ASSERT_TRUE(testing::WaitFor([&] { return GetRun(run.run_id()).state() == v1::FAILED; }, absl::Seconds(10)));
  auto run2 = Submit("writer-dies", 1, 2);
  EXPECT_EQ(run2.resume_step(), 10);
  run = run2;
  fs::remove(JoinPath(tmp_.path(), "rank0.log"));
  fs::remove(JoinPath(tmp_.path(), "rank1.log"));
  auto writer = spawn(0, 20, /*hang=*/true);
  auto other = spawn(1, 20, false);
  ASSERT_TRUE(testing::WaitFor(
      [&] { return testing::Slurp(JoinPath(tmp_.path(), "rank0.log")).find("partial=") != std::string::npos; },
      absl::Seconds(30)));
  bool saw_partial = false;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    saw_partial = saw_partial || e.path().filename().string().find("step-20.partial-") == 0;
  }
  EXPECT_TRUE(saw_partial);
  writer->Signal(SIGKILL);
  writer->Wait(absl::Seconds(5));
  // The survivor's commit is aborted once the writer is declared dead (heartbeat timeout 1 s).
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string l = testing::Slurp(JoinPath(tmp_.path(), "rank1.log"));
        return l.find("commit: ABORTED") != std::string::npos || l.find("stop:") != std::string::npos;
      },
      absl::Seconds(20)))
      << testing::Slurp(JoinPath(tmp_.path(), "rank1.log"));
  char target[64] = {0};
  ASSERT_GT(::readlink((ckpt + "/latest").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "step-10");
  for (const auto& e : fs::directory_iterator(ckpt)) {
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
  }
  EXPECT_FALSE(fs::exists(ckpt + "/step-20"));
  v1::Run status = GetRun(run.run_id());
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.reason().rank(), 0);
  EXPECT_EQ(status.latest_checkpoint_step(), 10);
}

TEST_F(IntegrationTest, MissingWrongAndOutOfScopeTokensAreRefused) {
  auto run_a = Submit("auth-a", 1, 1);
  auto run_b = Submit("auth-b", 1, 1);
  v1::GetRunRequest get;
  get.set_run_id(run_a.run_id());
  auto none = coord_.Client("");
  auto r = Call(*none, &v1::RunService::Stub::GetRun, none->runs(), get, absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(r.status().message().find("authorization"), std::string::npos);
  auto wrong = coord_.Client("dt_admin_not-the-token-at-all-000000000000");
  r = Call(*wrong, &v1::RunService::Stub::GetRun, wrong->runs(), get, absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  // Run B's token may read run B but not run A, and may not list or submit.
  auto b = coord_.Client(run_b.run_token());
  r = Call(*b, &v1::RunService::Stub::GetRun, b->runs(), get, absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  get.set_run_id(run_b.run_id());
  EXPECT_TRUE(Call(*b, &v1::RunService::Stub::GetRun, b->runs(), get, absl::Seconds(5)).ok());
  auto list = Call(*b, &v1::RunService::Stub::ListRuns, b->runs(), v1::ListRunsRequest(), absl::Seconds(5));
  EXPECT_EQ(list.status().code(), absl::StatusCode::kPermissionDenied);
  v1::StoreSetRequest set;
  set.mutable_scope()->set_run_id(run_a.run_id());
  set.set_key("k");
  auto s = Call(*b, &v1::StoreService::Stub::Set, b->store(), set, absl::Seconds(5));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  // The admin token may do anything.
  EXPECT_TRUE(
      Call(*admin_, &v1::RunService::Stub::ListRuns, admin_->runs(), v1::ListRunsRequest(), absl::Seconds(5)).ok());
}

TEST_F(IntegrationTest, StoreSessionHasC10dSemanticsAcrossClients) {
  auto run = Submit("store", 1, 2);
  auto agents = RegisterAll(run, 1, 2);
  auto s0 = agents[0]->OpenStore();
  auto s1 = agents[1]->OpenStore();
  ASSERT_TRUE(s0.ok() && s1.ok()) << s0.status() << s1.status();
  // A blocking get on one client is answered by a set from the other.
  absl::StatusOr<std::string> got;
  std::thread waiter([&] { got = (*s1)->Get("addr/rank0", absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE((*s0)->Set("addr/rank0", "10.0.0.1:1234").ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "10.0.0.1:1234");
  // Timeouts name the key.
  auto missing = (*s0)->Get("never", absl::Milliseconds(200));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("never"), std::string::npos);
  // Concurrent adds from many threads over two pipelined streams: atomic.
  std::vector<std::thread> adders;
  for (int t = 0; t < 8; ++t) {
    adders.emplace_back([&, t] {
      StoreSession& s = t % 2 == 0 ? **s0 : **s1;
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(s.Add("counter", 1).ok());
    });
  }
  for (auto& t : adders) t.join();
  EXPECT_EQ(*(*s0)->Add("counter", 0), 400);
  EXPECT_EQ(*(*s1)->CompareSet("cas", "", "v1"), "v1");
  EXPECT_EQ(*(*s0)->CompareSet("cas", "v1", "v2"), "v2");
  EXPECT_TRUE(*(*s0)->Check({"cas", "counter"}));
  ASSERT_TRUE((*s1)->Wait({"cas", "counter"}, absl::Seconds(1)).ok());
  EXPECT_TRUE(*(*s0)->DeleteKey("cas"));
  EXPECT_EQ(*(*s1)->NumKeys(), 2);  // addr/rank0, counter
  // Per-operation errors do not break the stream.
  EXPECT_EQ((*s0)->Set(std::string(600, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*s0)->Set("still-works", "yes").ok());
  // Sets sent without waiting (the c10d set): seen by later gets on any client, in order, also
  // past the number after which the session waits for the server to catch up.
  const int burst = StoreSession::kMaxUnanswered + 10;
  EXPECT_TRUE((*s0)->Quiescent());
  for (int i = 0; i < burst; ++i) ASSERT_TRUE((*s0)->SetNoWait(absl::StrCat("nw", i), absl::StrCat(i)).ok());
  EXPECT_FALSE((*s0)->Quiescent()) << "sets sent without waiting are unanswered";
  EXPECT_EQ(*(*s1)->Get(absl::StrCat("nw", burst - 1), absl::Seconds(5)), absl::StrCat(burst - 1));
  EXPECT_EQ(*(*s0)->Get("nw0", absl::Seconds(5)), "0");
  EXPECT_TRUE((*s0)->Quiescent()) << "the get was answered after every set";
  // A failed one is answered; the session reports it on a later call, then carries on.
  ASSERT_TRUE((*s0)->SetNoWait(std::string(600, 'k'), "v").ok());
  EXPECT_EQ(*(*s0)->Get("nw1", absl::Seconds(5)), "1");  // answered after the failed set
  EXPECT_FALSE((*s0)->Quiescent()) << "a failed set not yet reported";
  auto reported = (*s0)->Get("nw2", absl::Seconds(5));
  EXPECT_EQ(reported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reported.status().message().find("an earlier set failed"), std::string::npos) << reported.status();
  EXPECT_EQ(*(*s0)->Get("nw2", absl::Seconds(5)), "2");
  for (int i = 0; i < burst; ++i) ASSERT_TRUE(*(*s1)->DeleteKey(absl::StrCat("nw", i)));
  // The unary form sees the same store.
  v1::StoreGetRequest g;
  g.mutable_scope()->set_run_id(run.run_id());
  g.mutable_scope()->set_generation(0);
  g.mutable_scope()->set_rank(-1);
  g.set_key("still-works");
  auto unary = Call(*admin_, &v1::StoreService::Stub::Get, admin_->store(), g, absl::Seconds(5));
  ASSERT_TRUE(unary.ok()) << unary.status();
  EXPECT_EQ(unary->value(), "yes");
}

// The ranks of one node, each its own process, add to one counter through the node's store
// combiner: every add is carried in a batch by one of them, and each gets its own answer (the
// values handed out are exactly 1..N, as N adds one at a time would give).
// With sets and gets of each rank's own key between the adds (--with-sets): every get through
// the combiner returns what the same rank's set just stored, checked in the rank.
class CombinedStoreTest : public IntegrationTest, public ::testing::WithParamInterface<bool> {};

TEST_P(CombinedStoreTest, TheOperationsOfANodesRanksGoOutTogetherAndEachGetsItsOwnAnswer) {
  constexpr int kRanks = 4, kAdds = 300;
  const bool with_sets = GetParam();
  auto run = Submit("combined-adds", 1, kRanks);
  std::vector<std::unique_ptr<testing::Subprocess>> ranks;
  auto log = [&](int slot) { return JoinPath(tmp_.path(), absl::StrCat("adder", slot, ".log")); };
  for (int slot = 0; slot < kRanks; ++slot) {
    std::vector<std::string> args = SimRankArgs(run, slot);
    args.insert(args.end(), {"--adds", std::to_string(kAdds)});
    if (with_sets) args.push_back("--with-sets");
    ranks.push_back(std::make_unique<testing::Subprocess>(args, std::map<std::string, std::string>{}, log(slot)));
  }
  std::vector<int64_t> values;
  int64_t carried = 0, batches = 0;
  for (int slot = 0; slot < kRanks; ++slot) {
    ASSERT_TRUE(testing::WaitFor([&] { return testing::Slurp(log(slot)).find("carried=") != std::string::npos; },
                                 absl::Seconds(60)))
        << testing::Slurp(log(slot));
    std::string out = testing::Slurp(log(slot));
    size_t at = out.find("adds=") + 5;
    for (absl::string_view v : absl::StrSplit(out.substr(at, out.find('\n', at) - at), ',')) {
      values.push_back(std::stoll(std::string(v)));
    }
    size_t c = out.find("carried=") + 8;
    batches += std::stoll(out.substr(c));
    carried += std::stoll(out.substr(out.find('/', c) + 1));
  }
  std::sort(values.begin(), values.end());
  ASSERT_EQ(values.size(), size_t{kRanks * kAdds});
  for (int i = 0; i < kRanks * kAdds; ++i) ASSERT_EQ(values[i], i + 1) << "a value handed out twice or never";
  EXPECT_EQ(carried, (with_sets ? 3 : 1) * kRanks * kAdds) << "every operation went out in a node batch";
  EXPECT_GE(batches, 1);
  EXPECT_LE(batches, carried);
  // The store holds the sum.
  auto session = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), 0, -1);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(*(*session)->Add("shared-counter", 0), kRanks * kAdds);
}

INSTANTIATE_TEST_SUITE_P(AddsAlone, CombinedStoreTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(WithSetsAndGets, CombinedStoreTest, ::testing::Values(true));

// A batch of store operations is checked whole before any of it is applied; a valid one is
// answered per operation, each as if sent alone.
TEST_F(IntegrationTest, AStoreBatchIsCheckedWholeBeforeAnyOfItIsApplied) {
  auto run = Submit("batch", 1, 1);
  auto session = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), 0, -1);
  ASSERT_TRUE(session.ok()) << session.status();
  auto add = [](v1::StoreRequest& batch, uint64_t id, const std::string& key, int64_t delta) {
    v1::StoreRequest* op = batch.mutable_batch()->add_ops();
    op->set_id(id);
    op->mutable_add()->set_key(key);
    op->mutable_add()->set_delta(delta);
  };
  // A get may wait: not in a batch. The add before it is not applied.
  v1::StoreRequest mixed;
  add(mixed, 7, "c", 1);
  v1::StoreRequest* get = mixed.mutable_batch()->add_ops();
  get->set_id(8);
  get->mutable_get()->set_key("c");
  auto refused = (*session)->Call(mixed);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(refused->status().message().find("operation 1 of the store batch (id 8)"), std::string::npos)
      << refused->status().message();
  EXPECT_EQ(refused->batch_size(), 0);
  EXPECT_FALSE(*(*session)->Check({"c"})) << "nothing of a refused batch is applied";
  // Empty, and too many.
  v1::StoreRequest empty;
  empty.mutable_batch();
  auto refused_empty = (*session)->Call(empty);
  ASSERT_TRUE(refused_empty.ok()) << refused_empty.status();
  EXPECT_NE(refused_empty->status().message().find("1 to 1024 operations, not 0"), std::string::npos);
  v1::StoreRequest huge;
  for (int i = 0; i <= kMaxStoreBatchOps; ++i) add(huge, i, "c", 1);
  auto refused_huge = (*session)->Call(huge);
  ASSERT_TRUE(refused_huge.ok()) << refused_huge.status();
  EXPECT_EQ(refused_huge->status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(*(*session)->Check({"c"}));
  // A valid batch: in order, each answered with its id; one operation's failure is its own.
  ASSERT_TRUE((*session)->Set("text", "not a number").ok());
  v1::StoreRequest batch;
  add(batch, 1, "c", 5);
  add(batch, 2, "text", 1);
  add(batch, 3, "c", 2);
  v1::StoreRequest* count = batch.mutable_batch()->add_ops();
  count->set_id(4);
  count->mutable_num_keys();
  // A get that does not wait: the value when the key is there, `flag` false when it is not.
  // With max_value_bytes, a longer value is left out: present, and its length in `number`. The
  // session's open said so: a client combines gets only with a coordinator that takes them.
  EXPECT_TRUE((*session)->features().batch_get_if_present());
  for (auto [id, key, max] : {std::tuple{5, "text", 0}, std::tuple{6, "nothing", 0}, std::tuple{7, "text", 3}}) {
    v1::StoreRequest* get_now = batch.mutable_batch()->add_ops();
    get_now->set_id(id);
    get_now->mutable_get()->set_key(key);
    get_now->mutable_get()->set_if_present(true);
    get_now->mutable_get()->set_max_value_bytes(max);
  }
  auto answered = (*session)->Call(batch);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_FALSE(answered->has_status());
  ASSERT_EQ(answered->batch_size(), 7);
  std::map<uint64_t, v1::StoreResponse> by_id;
  for (const auto& r : answered->batch()) by_id[r.id()] = r;
  EXPECT_EQ(by_id[1].number(), 5);
  EXPECT_EQ(by_id[2].status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(by_id[3].number(), 7);
  EXPECT_EQ(by_id[4].number(), 2);  // text, c
  EXPECT_FALSE(by_id[5].has_status());
  EXPECT_TRUE(by_id[5].flag());
  EXPECT_EQ(by_id[5].value(), "not a number");
  EXPECT_FALSE(by_id[6].has_status()) << "an absent key is no error";
  EXPECT_FALSE(by_id[6].flag());
  EXPECT_EQ(by_id[6].value(), "");
  EXPECT_TRUE(by_id[7].flag());
  EXPECT_EQ(by_id[7].value(), "");
  EXPECT_EQ(by_id[7].number(), 12);  // "not a number"
  EXPECT_EQ(*(*session)->Add("c", 0), 7);
}

// The unary store RPCs go through the same operations as the session: each answers with what the
// session would, and an error names its cause.
TEST_F(IntegrationTest, EveryUnaryStoreRpcAnswersAsTheSessionDoes) {
  auto run = Submit("store-unary", 1, 1);
  auto agents = RegisterAll(run, 1, 1);
  v1::StoreScope scope;
  scope.set_run_id(run.run_id());
  scope.set_generation(0);
  scope.set_rank(-1);
  auto store = admin_->store();
  v1::StoreSetRequest set;
  *set.mutable_scope() = scope;
  set.set_key("k");
  set.set_value("v");
  ASSERT_TRUE(Call(*admin_, &v1::StoreService::Stub::Set, store, set, absl::Seconds(5)).ok());
  v1::StoreAddRequest add;
  *add.mutable_scope() = scope;
  add.set_key("n");
  add.set_delta(5);
  ASSERT_EQ(Call(*admin_, &v1::StoreService::Stub::Add, store, add, absl::Seconds(5))->value(), 5);
  add.set_delta(-2);
  ASSERT_EQ(Call(*admin_, &v1::StoreService::Stub::Add, store, add, absl::Seconds(5))->value(), 3);
  v1::StoreCompareSetRequest cas;
  *cas.mutable_scope() = scope;
  cas.set_key("k");
  cas.set_expected("v");
  cas.set_desired("w");
  EXPECT_EQ(Call(*admin_, &v1::StoreService::Stub::CompareSet, store, cas, absl::Seconds(5))->value(), "w");
  cas.set_expected("not-it");
  EXPECT_EQ(Call(*admin_, &v1::StoreService::Stub::CompareSet, store, cas, absl::Seconds(5))->value(), "w");
  v1::StoreCheckRequest check;
  *check.mutable_scope() = scope;
  check.add_keys("k");
  check.add_keys("n");
  EXPECT_TRUE(Call(*admin_, &v1::StoreService::Stub::Check, store, check, absl::Seconds(5))->all_exist());
  check.add_keys("missing");
  EXPECT_FALSE(Call(*admin_, &v1::StoreService::Stub::Check, store, check, absl::Seconds(5))->all_exist());
  v1::StoreNumKeysRequest num;
  *num.mutable_scope() = scope;
  EXPECT_EQ(Call(*admin_, &v1::StoreService::Stub::NumKeys, store, num, absl::Seconds(5))->num_keys(), 2);
  v1::StoreDeleteKeyRequest del;
  *del.mutable_scope() = scope;
  del.set_key("k");
  EXPECT_TRUE(Call(*admin_, &v1::StoreService::Stub::DeleteKey, store, del, absl::Seconds(5))->deleted());
  EXPECT_FALSE(Call(*admin_, &v1::StoreService::Stub::DeleteKey, store, del, absl::Seconds(5))->deleted());
  // A blocking wait answered when another client sets the key.
  v1::StoreWaitRequest wait;
  *wait.mutable_scope() = scope;
  wait.add_keys("later");
  wait.set_timeout_ms(10'000);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    v1::StoreSetRequest later = set;
    later.set_key("later");
    (void)Call(*admin_, &v1::StoreService::Stub::Set, store, later, absl::Seconds(5));
  });
  auto waited = Call(*admin_, &v1::StoreService::Stub::Wait, store, wait, absl::Seconds(15));
  setter.join();
  EXPECT_TRUE(waited.ok()) << waited.status();
  // Errors keep their code and cause.
  v1::StoreGetRequest get;
  *get.mutable_scope() = scope;
  get.set_key("never");
  get.set_timeout_ms(100);
  auto timed_out = Call(*admin_, &v1::StoreService::Stub::Get, store, get, absl::Seconds(5));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded) << timed_out.status();
  EXPECT_NE(timed_out.status().message().find("never"), std::string::npos) << timed_out.status();
  // With if_present the same get answers at once: not there.
  get.set_if_present(true);
  auto not_there = Call(*admin_, &v1::StoreService::Stub::Get, store, get, absl::Seconds(5));
  ASSERT_TRUE(not_there.ok()) << not_there.status();
  EXPECT_FALSE(not_there->present());
  get.set_key("later");
  auto there = Call(*admin_, &v1::StoreService::Stub::Get, store, get, absl::Seconds(5));
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_TRUE(there->present());
  get.set_key("never");
  get.set_if_present(false);
  get.set_timeout_ms(-1);
  EXPECT_EQ(Call(*admin_, &v1::StoreService::Stub::Get, store, get, absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  add.set_key("k-not-a-number");
  set.set_key("k-not-a-number");
  set.set_value("abc");
  ASSERT_TRUE(Call(*admin_, &v1::StoreService::Stub::Set, store, set, absl::Seconds(5)).ok());
  EXPECT_EQ(Call(*admin_, &v1::StoreService::Stub::Add, store, add, absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(IntegrationTest, StoreOfAnEndedGenerationIsAborted) {
  auto run = Submit("store-abort", 1, 2, /*max_restarts=*/1);
  auto agents = RegisterAll(run, 1, 2);
  auto s0 = agents[0]->OpenStore();
  ASSERT_TRUE(s0.ok());
  absl::StatusOr<std::string> got;
  std::thread waiter([&] { got = (*s0)->Get("never-set", absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(agents[1]->ReportError("boom", "std::runtime_error", "", 3).ok());
  waiter.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(got.status().message().find("boom"), std::string::npos) << got.status();
  EXPECT_EQ(GetRun(run.run_id()).state(), v1::RESTARTING);
}

TEST_F(IntegrationTest, WatchStreamsStateChangesUntilTheRunEnds) {
  auto run = Submit("watch", 1, 2);
  auto ctx = admin_->Context(absl::Seconds(30));
  v1::WatchRunRequest req;
  req.set_run_id(run.run_id());
  req.set_include_metrics(true);
  auto reader = admin_->runs().WatchRun(ctx.get(), req);
  std::vector<v1::RunState> states;
  int metric_events = 0;
  // The first event is the snapshot as of the watch's start: read it before anything changes the
  // run (the server may take up the call only after registration began, skipping PENDING).
  v1::RunEvent first;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_TRUE(first.has_snapshot());
  states.push_back(first.snapshot().state());
  std::thread consumer([&] {
    v1::RunEvent e;
    while (reader->Read(&e)) {
      if (e.has_snapshot() && (states.empty() || states.back() != e.snapshot().state())) {
        states.push_back(e.snapshot().state());
      }
      if (e.has_metric()) ++metric_events;
    }
  });
  auto agents = RegisterAll(run, 1, 2);
  {
    MetricsReporter reporter(coord_.Client(run.run_token()), run.run_id(), 0, 0);
    reporter.Add(1, {{"loss", 3.5}});
    ASSERT_TRUE(reporter.Flush(absl::Seconds(5)).ok());
  }
  ASSERT_TRUE(agents[0]->Leave(10).ok());
  ASSERT_TRUE(agents[1]->Leave(10).ok());
  consumer.join();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(states.front(), v1::PENDING);
  EXPECT_EQ(states.back(), v1::SUCCEEDED);
  EXPECT_NE(std::find(states.begin(), states.end(), v1::RUNNING), states.end());
  EXPECT_EQ(metric_events, 1);
}

TEST_F(IntegrationTest, MetricsAreStoredAndQueryable) {
  auto run = Submit("metrics", 1, 1);
  auto agents = RegisterAll(run, 1, 1);
  {
    MetricsReporter reporter(coord_.Client(run.run_token()), run.run_id(), 0, 0, absl::Milliseconds(50));
    for (int step = 1; step <= 20; ++step) reporter.Add(step, {{"loss", 10.0 / step}, {"lr", 0.001}});
  }  // the destructor flushes
  v1::QueryMetricsRequest q;
  q.set_run_id(run.run_id());
  q.set_name("loss");
  auto r = Call(*admin_, &v1::MetricsService::Stub::QueryMetrics, admin_->metrics(), q, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records_size(), 20);
  EXPECT_EQ(r->records(0).step(), 1);
  EXPECT_DOUBLE_EQ(r->records(19).value(), 0.5);
  // A malformed batch is refused with the reason, over the stream.
  v1::MetricBatch bad;
  bad.set_run_id(run.run_id());
  bad.set_rank(5);
  grpc::Status st = ReportBatch(*admin_, bad, absl::Seconds(5));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("rank 5"), std::string::npos);
}

// The coordinator says it reads columns; a batch of columns (a value absent) is stored and read
// back as the same points; a reporter's later flushes, which go as columns, lose nothing either.
TEST_F(IntegrationTest, MetricColumnsAreStoredAndQueryableLikePoints) {
  auto run = Submit("columns", 1, 1);
  auto agents = RegisterAll(run, 1, 1);
  v1::MetricBatch batch;
  batch.set_run_id(run.run_id());
  v1::MetricColumns* c = batch.mutable_columns();
  c->add_names("loss");
  c->add_names("lr");
  for (int step = 1; step <= 3; ++step) {
    c->add_steps(step);
    c->add_times(1000 + step);
    c->add_values(4.0 - step);
    c->add_values(0.01 * step);
  }
  c->set_absent(std::string(1, '\x08'));  // value 3: step 2's lr
  auto ctx = admin_->Context(absl::Seconds(5));
  v1::ReportMetricsResponse resp;
  auto writer = admin_->metrics().ReportMetrics(ctx.get(), &resp);
  ASSERT_TRUE(writer->Write(batch));
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_TRUE(resp.accepts_columns());
  EXPECT_EQ(resp.points_accepted(), 3);
  {
    MetricsReporter reporter(coord_.Client(run.run_token()), run.run_id(), 0, 0, absl::Milliseconds(50));
    for (int step = 4; step <= 40; ++step) {
      reporter.Add(step, {{"loss", 10.0 / step}, {"lr", 0.001}});
      if (step % 10 == 0) {
        ASSERT_TRUE(reporter.Flush(absl::Seconds(5)).ok());  // points, then columns
      }
    }
  }
  v1::QueryMetricsRequest q;
  q.set_run_id(run.run_id());
  auto r = Call(*admin_, &v1::MetricsService::Stub::QueryMetrics, admin_->metrics(), q, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  std::map<std::pair<int64_t, std::string>, double> stored;
  for (const auto& rec : r->records()) stored[{rec.step(), rec.name()}] = rec.value();
  EXPECT_EQ(stored.size(), 3u * 2 - 1 + 37u * 2);
  EXPECT_EQ(stored.count({2, "lr"}), 0u) << "an absent value was stored";
  EXPECT_DOUBLE_EQ((stored[{3, "lr"}]), 0.03);
  EXPECT_DOUBLE_EQ((stored[{1, "loss"}]), 3.0);
  for (int step = 4; step <= 40; ++step) EXPECT_DOUBLE_EQ((stored[{step, "loss"}]), 10.0 / step) << step;
  // Columns whose sizes disagree are refused with the reason, over the stream.
  c->add_values(1.0);
  grpc::Status st = ReportBatch(*admin_, batch, absl::Seconds(5));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("7 values for 3 steps x 2 names"), std::string::npos) << st.error_message();
}

// A stream reads ahead of storage (several batches in flight): the batches before a malformed one
// are stored, the stream ends with its reason once they are, and nothing after it is taken.
TEST_F(IntegrationTest, AMalformedBatchEndsAStreamAfterTheBatchesBeforeItAreStored) {
  auto run = Submit("read-ahead", 1, 1);
  auto agents = RegisterAll(run, 1, 1);
  auto ctx = admin_->Context(absl::Seconds(10));
  v1::ReportMetricsResponse resp;
  auto writer = admin_->metrics().ReportMetrics(ctx.get(), &resp);
  for (int step = 1; step <= 40; ++step) {
    v1::MetricBatch b = LossBatch(run.run_id(), step, 1.0 * step);
    if (step == 31) b.mutable_points(0)->set_step(-1);
    if (!writer->Write(b)) break;  // the stream may end before the last writes
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("step -1 is negative"), std::string::npos) << st.error_message();
  // (A stream that fails carries no response message: the history says what was stored.)
  v1::QueryMetricsRequest q;
  q.set_run_id(run.run_id());
  auto r = Call(*admin_, &v1::MetricsService::Stub::QueryMetrics, admin_->metrics(), q, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records_size(), 30) << "the batches before the malformed one are stored, none after it";
  for (int i = 0; i < 30; ++i) EXPECT_EQ(r->records(i).step(), i + 1);
}

// A stream that ended OK is never sent again (MetricsReporter drops what it delivered): it ends
// only once W&B's spool and Prometheus have every batch, not when the batches are stored, or a
// coordinator killed in between would lose those points for W&B.
TEST_F(IntegrationTest, AMetricStreamEndsOkOnlyOnceItsBatchesAreDelivered) {
  testing::HeldMetricObserver& observer = held_observer_;
  coord_.coordinator().AddObserver(&observer);
  auto run = Submit("held-delivery", 1, 1);
  auto agents = RegisterAll(run, 1, 1);
  agents[0]->StartHeartbeats([](const std::string&) {});  // the watchdog's timeout here is 1 s
  std::shared_ptr<CoordinatorClient> client = coord_.Client(run.run_token());
  absl::Notification ended;
  grpc::Status stream_status;
  std::thread sender([&] {
    stream_status = ReportBatch(*client, LossBatch(run.run_id(), 11, 0.5), absl::Seconds(60));
    ended.Notify();
  });
  absl::Cleanup join_sender = [&] {
    observer.Release();
    if (sender.joinable()) sender.join();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return observer.delivered() == 1; }, absl::Seconds(30)));
  // The batch is stored and its delivery held: the stream has not ended.
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Seconds(2)));
  observer.Release();
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(stream_status.ok()) << stream_status.error_message();
  EXPECT_EQ(coord_.coordinator().metrics().Unstored(), 0);
}

// A disk that stalls writes (dirty-page writeback, a busy shared file system) held the run's lock
// and the gRPC threads while a metric batch was stored: heartbeats and store calls waited seconds
// and the watchdog could fail healthy ranks. Here another connection holds the state database's
// write lock (SQLite's own locking) while a batch is being stored: heartbeats and store calls of
// the same run still answer, and the batch is stored, the stream ending OK, once the lock is gone.
TEST_F(IntegrationTest, HeartbeatsAndStoreCallsAnswerWhileMetricStorageWaitsForTheDisk) {
  auto run = Submit("slow-disk", 1, 1);
  auto agents = RegisterAll(run, 1, 1);
  agents[0]->StartHeartbeats([](const std::string&) {});  // the watchdog's timeout here is 1 s
  auto session = StoreSession::Open(coord_.Client(run.run_token()), run.run_id(), agents[0]->generation(), 0);
  ASSERT_TRUE(session.ok()) << session.status();

  testing::StateDbWriteLock disk_stall(tmp_.Sub("state"));
  ASSERT_TRUE(disk_stall.held());

  std::shared_ptr<CoordinatorClient> client = coord_.Client(run.run_token());
  grpc::Status stream_status;
  std::thread sender([&] { stream_status = ReportBatch(*client, LossBatch(run.run_id(), 7, 2.5), absl::Seconds(60)); });
  absl::Cleanup join_sender = [&sender] {
    if (sender.joinable()) sender.join();
  };
  // The batch was accepted and waits for the database.
  ASSERT_TRUE(testing::WaitFor([&] { return coord_.coordinator().metrics().Unstored() > 0; }, absl::Seconds(30)));
  ASSERT_EQ(coord_.coordinator().metrics().Unstored(), 1);

  // SQLite's busy timeout is 5 s: before this fix, each call below waited for it to expire.
  v1::HeartbeatRequest hb;
  hb.set_run_id(run.run_id());
  hb.set_generation(agents[0]->generation());
  hb.set_rank(0);
  hb.set_incarnation(agents[0]->incarnation());
  hb.set_step(3);
  auto answered = Call(*client, &v1::RendezvousService::Stub::Heartbeat, client->rendezvous(), hb, absl::Seconds(3));
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->directive(), v1::HeartbeatResponse::CONTINUE);
  ASSERT_TRUE((*session)->Set("during-stall", "yes").ok());
  EXPECT_EQ(*(*session)->Get("during-stall"), "yes");
  EXPECT_EQ(coord_.coordinator().metrics().Unstored(), 1);

  disk_stall.Release();
  sender.join();
  ASSERT_TRUE(stream_status.ok()) << stream_status.error_message();
  EXPECT_EQ(coord_.coordinator().metrics().Unstored(), 0);
  v1::QueryMetricsRequest q;
  q.set_run_id(run.run_id());
  auto stored = Call(*admin_, &v1::MetricsService::Stub::QueryMetrics, admin_->metrics(), q, absl::Seconds(5));
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->records_size(), 1);
  EXPECT_EQ(stored->records(0).step(), 7);
  EXPECT_DOUBLE_EQ(stored->records(0).value(), 2.5);
}

// A request gRPC cannot parse gets INVALID_ARGUMENT naming the method, not UNIMPLEMENTED.
TEST_F(IntegrationTest, ARequestThatCannotBeParsedIsInvalidArgumentNotUnimplemented) {
  auto run = Submit("unparsable", 1, 1);
  grpc::GenericStub stub(admin_->channel());
  auto call = [&](const std::string& method, const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    auto ctx = admin_->Context(absl::Seconds(5));
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(ctx.get(), method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  };
  // GetRunRequest.run_id (field 1) holding the bytes ff fe: not UTF-8.
  grpc::Status bad = call("/dt.v1.RunService/GetRun", std::string("\x0a\x02\xff\xfe", 4));
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_NE(bad.error_message().find("/dt.v1.RunService/GetRun: the request could not be parsed"), std::string::npos)
      << bad.error_message();
  // The same call well-formed still works, and an unknown method is still UNIMPLEMENTED.
  v1::GetRunRequest good;
  good.set_run_id(run.run_id());
  EXPECT_TRUE(call("/dt.v1.RunService/GetRun", good.SerializeAsString()).ok());
  EXPECT_EQ(call("/dt.v1.RunService/NoSuchMethod", "").error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(IntegrationTest, HealthAndReflectionAnswerWithoutAToken) {
  auto channel = grpc::CreateChannel(coord_.address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""} is empty
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING

  // Reflection: list_services (field 7, empty string) names the dt services.
  grpc::ClientContext rctx;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&rctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice list(std::string("\x3a\x00", 2));
  call->Write(grpc::ByteBuffer(&list, 1), reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  slices.clear();
  ASSERT_TRUE(reply.Dump(&slices).ok());
  bytes.clear();
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  for (const char* service : {"dt.v1.RunService", "dt.v1.StoreService", "dt.v1.CheckpointService"}) {
    EXPECT_NE(bytes.find(service), std::string::npos) << service;
  }
  rctx.TryCancel();
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// --tls-cert/--tls-key: clients that trust the certificate talk TLS; plaintext ones cannot.
TEST(CoordinatorTlsTest, ServesTlsToClientsThatTrustItsCertificate) {
  testing::TempDir tmp;
  std::string cert = JoinPath(tmp.path(), "cert.pem"), key = JoinPath(tmp.path(), "key.pem");
  auto made =
      RunCommand({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days",
                  "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"},
                 absl::Seconds(60));
  ASSERT_TRUE(made.ok() && made->exit_code == 0) << (made.ok() ? made->output : made.status().ToString());
  testing::CoordinatorProcess coord(tmp.path(), {"--tls-cert", cert, "--tls-key", key});
  ClientOptions o;
  o.address = coord.address();
  o.token = coord.admin_token();
  o.tls_ca_file = cert;
  auto tls = *CoordinatorClient::Connect(o);
  auto listed = Call(*tls, &v1::RunService::Stub::ListRuns, tls->runs(), v1::ListRunsRequest(), absl::Seconds(10));
  EXPECT_TRUE(listed.ok()) << listed.status();
  o.tls_ca_file = "";
  auto plain = *CoordinatorClient::Connect(o);
  auto refused = Call(*plain, &v1::RunService::Stub::ListRuns, plain->runs(), v1::ListRunsRequest(), absl::Seconds(3));
  EXPECT_FALSE(refused.ok());
  // Both flags or neither.
  auto half = RunCommand({testing::BinaryPath("dtcoord"), "--listen", "127.0.0.1:0", "--state-dir",
                          JoinPath(tmp.path(), "half"), "--metrics-listen", "off", "--tls-cert", cert},
                         absl::Seconds(20));
  ASSERT_TRUE(half.ok());
  EXPECT_NE(half->exit_code, 0);
  EXPECT_NE(half->output.find("--tls-key"), std::string::npos) << half->output;
}

// Two dtcoord on one state dir would each accept runs the other does not know: the second is
// refused, named the first, and the first serves on.
TEST(CoordinatorStateDirTest, ASecondCoordinatorOnTheSameStateDirIsRefused) {
  testing::TempDir tmp;
  testing::CoordinatorProcess first(tmp.path());
  auto second = RunCommand({testing::BinaryPath("dtcoord"), "--listen", "127.0.0.1:0", "--state-dir", first.state_dir(),
                            "--metrics-listen", "off"},
                           absl::Seconds(30));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->exit_code, 1) << second->output;
  EXPECT_NE(second->output.find(absl::StrCat("in use by another dtcoord (pid ", first.process().pid(), " serving on ",
                                             first.address(), ")")),
            std::string::npos)
      << second->output;
  EXPECT_TRUE(first.process().running());
  v1::ListRunsRequest list;
  auto admin = first.AdminClient();
  EXPECT_TRUE(Call(*admin, &v1::RunService::Stub::ListRuns, admin->runs(), list, absl::Seconds(5)).ok());
}

// The store's byte limits, set by dtcoord's flags, and Get/Wait timeouts, over real gRPC.
TEST(CoordinatorStoreLimitsTest, StoreBytesAndWaitTimeoutsAreBoundedOverTheWire) {
  testing::TempDir tmp;
  testing::CoordinatorProcess coord(tmp.path(), {"--store-bytes-per-run", "10MiB", "--store-bytes-total", "12MiB"});
  std::string save = tmp.Sub("runs");
  auto a = coord.Submit(testing::MakeSpec("a", save, 1, 1));
  auto b = coord.Submit(testing::MakeSpec("b", save, 1, 1));
  auto admin = coord.AdminClient();
  auto set = [&](const v1::SubmitRunResponse& run, const std::string& key) {
    v1::StoreSetRequest req;
    req.mutable_scope()->set_run_id(run.run_id());
    req.mutable_scope()->set_rank(-1);
    req.set_key(key);
    req.set_value(std::string(4 << 20, 'v'));
    return Call(*admin, &v1::StoreService::Stub::Set, admin->store(), req, absl::Seconds(10)).status();
  };
  ASSERT_TRUE(set(a, "k0").ok());
  ASSERT_TRUE(set(a, "k1").ok());
  absl::Status per_run = set(a, "k2");
  EXPECT_EQ(per_run.code(), absl::StatusCode::kResourceExhausted) << per_run;
  EXPECT_NE(per_run.message().find("10485760 bytes per run (dtcoord --store-bytes-per-run)"), std::string::npos)
      << per_run;
  absl::Status total = set(b, "k0");
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted) << total;
  EXPECT_NE(total.message().find("--store-bytes-total"), std::string::npos) << total;
  v1::StoreDeleteKeyRequest del;
  del.mutable_scope()->set_run_id(a.run_id());
  del.mutable_scope()->set_rank(-1);
  del.set_key("k0");
  ASSERT_TRUE(Call(*admin, &v1::StoreService::Stub::DeleteKey, admin->store(), del, absl::Seconds(5)).ok());
  EXPECT_TRUE(set(b, "k0").ok());

  for (int64_t bad : {int64_t{-5}, int64_t{1} << 62}) {
    v1::StoreGetRequest get;
    get.mutable_scope()->set_run_id(a.run_id());
    get.mutable_scope()->set_rank(-1);
    get.set_key("k1");
    get.set_timeout_ms(bad);
    auto got = Call(*admin, &v1::StoreService::Stub::Get, admin->store(), get, absl::Seconds(5));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << got.status();
    EXPECT_NE(got.status().message().find("timeout_ms must be within"), std::string::npos) << got.status();
    v1::StoreWaitRequest wait;
    *wait.mutable_scope() = get.scope();
    wait.add_keys("k1");
    wait.set_timeout_ms(bad);
    auto waited = Call(*admin, &v1::StoreService::Stub::Wait, admin->store(), wait, absl::Seconds(5));
    EXPECT_EQ(waited.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << waited.status();
  }
}

// dtcoord --max-ranks: a storm of submissions past it is refused with RESOURCE_EXHAUSTED naming
// the limit and makes nothing, while the admitted run's heartbeats are answered; exactly as many
// small runs as fit are admitted when they race; an ended run gives its ranks back; a restarted
// dtcoord counts the runs it loads.
TEST(CoordinatorRankLimitTest, SubmissionsPastMaxRanksAreRefusedWhileTheAdmittedRunIsServed) {
  testing::TempDir tmp;
  testing::CoordinatorProcess coord(tmp.path(), {"--max-ranks", "8"});
  std::string save = tmp.Sub("runs");
  auto admin = coord.AdminClient();
  v1::SubmitRunResponse admitted = coord.Submit(testing::MakeSpec("admitted", save, 1, 4));
  auto agents = testing::RegisterAgents(coord.Client(admitted.run_token()), admitted.run_id(), "n1", 4);
  ASSERT_EQ(agents.size(), 4u);

  auto submit = [&](const std::string& name, int nodes, int ppn) {
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec(name, save, nodes, ppn);
    return Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  };
  // The storm, beside the admitted run's four ranks heartbeating.
  std::atomic<bool> storming{true};
  std::atomic<int> heartbeats{0};
  std::vector<std::string> heartbeat_errors;
  std::thread heartbeater([&] {
    auto client = coord.Client(admitted.run_token());
    while (storming.load()) {
      for (const auto& agent : agents) {
        v1::HeartbeatRequest hb;
        hb.set_run_id(admitted.run_id());
        hb.set_rank(agent->rank());
        hb.set_generation(agent->generation());
        hb.set_incarnation(agent->incarnation());
        auto answer =
            Call(*client, &v1::RendezvousService::Stub::Heartbeat, client->rendezvous(), hb, absl::Seconds(5));
        if (!answer.ok() || answer->directive() != v1::HeartbeatResponse::CONTINUE) {
          heartbeat_errors.push_back(answer.ok() ? answer->reason() : answer.status().ToString());
        }
        ++heartbeats;
      }
    }
  });
  std::atomic<int> refused{0};
  std::vector<std::string> wrong;
  absl::Mutex wrong_mu;
  std::vector<std::thread> storm;
  for (int t = 0; t < 8; ++t) {
    storm.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        auto r = submit(absl::StrCat("storm-", t, "-", i), 2, 4);
        if (r.status().code() == absl::StatusCode::kResourceExhausted &&
            absl::StrContains(r.status().message(), "at most 8 ranks at once (dtcoord --max-ranks)") &&
            absl::StrContains(r.status().message(), "hold 4 and run \"storm-")) {
          ++refused;
        } else {
          absl::MutexLock lock(&wrong_mu);
          wrong.push_back(r.status().ToString());
        }
      }
    });
  }
  for (auto& t : storm) t.join();
  storming = false;
  heartbeater.join();
  EXPECT_EQ(refused.load(), 200);
  EXPECT_TRUE(wrong.empty()) << absl::StrJoin(wrong, "\n");
  EXPECT_GT(heartbeats.load(), 0);
  EXPECT_TRUE(heartbeat_errors.empty()) << absl::StrJoin(heartbeat_errors, "\n");
  // Nothing of a refused run was made.
  auto experiment_dirs = [&save] {  // sorted
    std::vector<std::string> dirs;
    for (const auto& entry : fs::directory_iterator(save)) dirs.push_back(entry.path().filename().string());
    std::sort(dirs.begin(), dirs.end());
    return dirs;
  };
  EXPECT_EQ(experiment_dirs(), std::vector<std::string>{"admitted"});
  EXPECT_EQ(coord.GetRun(admitted.run_id()).state(), v1::RUNNING);

  // Small runs racing for the four ranks left: exactly four get in.
  std::vector<std::string> small_admitted;
  absl::Mutex small_mu;
  std::vector<std::thread> racers;
  for (int t = 0; t < 12; ++t) {
    racers.emplace_back([&, t] {
      std::string name = absl::StrCat("small-", t);
      auto r = submit(name, 1, 1);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      }
      absl::MutexLock lock(&small_mu);
      if (r.ok()) small_admitted.push_back(name);
    });
  }
  for (auto& t : racers) t.join();
  EXPECT_EQ(small_admitted.size(), 4u);
  // The racers refused made no directory either.
  small_admitted.push_back("admitted");
  std::sort(small_admitted.begin(), small_admitted.end());
  EXPECT_EQ(experiment_dirs(), small_admitted);

  // Cancelling the four-rank run gives its ranks back.
  v1::CancelRunRequest cancel;
  cancel.set_run_id(admitted.run_id());
  ASSERT_TRUE(Call(*admin, &v1::RunService::Stub::CancelRun, admin->runs(), cancel, absl::Seconds(10)).ok());
  ASSERT_TRUE(submit("after-cancel", 1, 4).ok());

  // After a restart the loaded runs still hold all eight.
  coord.KillAndRestart();
  absl::StatusOr<v1::SubmitRunResponse> after_restart;
  // UNAVAILABLE until the channel has reconnected to the restarted dtcoord.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        after_restart = submit("after-restart", 1, 1);
        return after_restart.status().code() != absl::StatusCode::kUnavailable;
      },
      absl::Seconds(20)));
  EXPECT_EQ(after_restart.status().code(), absl::StatusCode::kResourceExhausted) << after_restart.status();
  EXPECT_TRUE(absl::StrContains(after_restart.status().message(), "hold 8 and")) << after_restart.status();
}

// kill -9 of the dtcoord binary: every run is still there after a restart on the same state
// dir, and the trainers of a running run carry on.
TEST(CoordinatorRestartTest, KillNineKeepsRunsAndRunningTrainersCarryOn) {
  testing::TempDir tmp;
  std::string state = tmp.Sub("state");
  std::string save = tmp.Sub("runs");
  auto start = [&](const std::string& listen) {
    return std::make_unique<testing::Subprocess>(
        std::vector<std::string>{testing::BinaryPath("dtcoord"), "--listen", listen, "--state-dir", state,
                                 "--metrics-listen", "off", "--heartbeat-interval", "100ms", "--heartbeat-timeout",
                                 "3s", "--hang-timeout", "1m"},
        std::map<std::string, std::string>{}, JoinPath(tmp.path(), "dtcoord.log"));
  };
  auto coord = start("127.0.0.1:0");
  std::string addr_file = JoinPath(state, "dtcoord.addr");
  ASSERT_TRUE(testing::WaitFor([&] { return !testing::Slurp(addr_file).empty(); }, absl::Seconds(10)))
      << testing::Slurp(JoinPath(tmp.path(), "dtcoord.log"));
  std::string address = testing::Slurp(addr_file);
  address.erase(address.find_last_not_of("\n") + 1);
  std::string token = testing::Slurp(JoinPath(state, "admin.token"));
  token.erase(token.find_last_not_of("\n") + 1);
  ClientOptions o;
  o.address = address;
  o.token = token;
  auto admin = *CoordinatorClient::Connect(o);

  std::vector<std::string> run_ids;
  std::vector<std::string> run_tokens;
  for (const char* name : {"kept-a", "kept-b"}) {
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec(name, save, 1, 2);
    auto r = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
    run_ids.push_back(r->run_id());
    run_tokens.push_back(r->run_token());
  }
  // Run A trains: two agents register and heartbeat.
  std::vector<std::unique_ptr<Agent>> agents;
  o.token = run_tokens[0];
  for (int s = 0; s < 2; ++s) {
    AgentOptions id;
    id.run_id = run_ids[0];
    id.node = "n1";
    id.local_slot = s;
    id.host = "h";
    agents.push_back(std::make_unique<Agent>(*CoordinatorClient::Connect(o), id));
  }
  std::thread other([&] { ASSERT_TRUE(agents[1]->Register(absl::Seconds(10)).ok()); });
  ASSERT_TRUE(agents[0]->Register(absl::Seconds(10)).ok());
  other.join();
  std::atomic<int> stops{0};
  for (auto& a : agents) {
    a->ReportProgress(7, 100);
    a->StartHeartbeats([&](const std::string& reason) { ++stops; });
  }
  absl::SleepFor(absl::Milliseconds(500));

  coord->Signal(SIGKILL);
  ASSERT_NE(coord->Wait(absl::Seconds(5)), -1);
  absl::SleepFor(absl::Milliseconds(500));  // trainers keep trying meanwhile
  coord = start(address);
  ASSERT_TRUE(admin->WaitConnected(absl::Seconds(10)).ok());

  v1::ListRunsRequest list;
  auto runs = Call(*admin, &v1::RunService::Stub::ListRuns, admin->runs(), list, absl::Seconds(5));
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->runs_size(), 2);
  // Newest first.
  EXPECT_EQ(runs->runs(0).run_id(), run_ids[1]);
  EXPECT_EQ(runs->runs(0).state(), v1::PENDING);
  v1::GetRunRequest get;
  get.set_run_id(run_ids[0]);
  // Survives more than a heartbeat timeout after the restart: the trainers reconnected.
  absl::SleepFor(absl::Seconds(4));
  auto a = Call(*admin, &v1::RunService::Stub::GetRun, admin->runs(), get, absl::Seconds(5));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->state(), v1::RUNNING) << a->reason().message();
  EXPECT_EQ(a->step(), 7);
  EXPECT_EQ(stops.load(), 0);
  ASSERT_TRUE(agents[0]->Leave(100).ok());
  ASSERT_TRUE(agents[1]->Leave(100).ok());
  a = Call(*admin, &v1::RunService::Stub::GetRun, admin->runs(), get, absl::Seconds(5));
  EXPECT_EQ(a->state(), v1::SUCCEEDED);
  for (auto& ag : agents) ag->StopHeartbeats();
  coord->Signal(SIGTERM);
  int status = coord->Wait(absl::Seconds(10));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);  // SIGTERM drains and exits 0
}

}  // namespace
}  // namespace dt

namespace dt {
namespace {

// dtcoord's command line: each mistake named with what to do, before anything is created; a
// second dtcoord on a port one already serves fails instead of sharing it.
TEST(DtcoordFlagsTest, MistakesAreNamedAndNothingIsCreated) {
  testing::TempDir tmp;
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--state-dir", JoinPath(tmp.path(), "unused")});
    return testing::RunBinary("dtcoord", args, {}, absl::Seconds(20));
  };
  std::string cert = JoinPath(tmp.path(), "not-a-cert.pem");
  ASSERT_TRUE(WriteFileAtomic(cert, "hello\n").ok());
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"--listen", "garbage"}, "--listen: \"garbage\" is not HOST:PORT"},
      {{"--listen", "127.0.0.1:99999"}, "the port must be a number in 0..65535"},
      {{"--listen", "127.0.0.1:"}, "the port must be a number in 0..65535"},
      {{"--metrics-listen", "9464"}, "--metrics-listen: \"9464\" is not HOST:PORT"},
      {{"--http-listen", "0.0.0.0:0"}, "is not a loopback address"},
      {{"--wandb-workers", "0"}, "--wandb-workers: must be ≥ 1, got 0"},
      {{"--heartbeat-timeout", "abc"}, "--heartbeat-timeout"},
      {{"--checkpoint-verify", "all"}, "--checkpoint-verify must be 'sizes' or 'digests', got 'all'"},
      {{"--bogus"}, "unknown argument --bogus"},
      {{"--listen"}, "--listen needs a value"},
  };
  for (const Case& c : cases) {
    CommandResult r = run(c.args);
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << absl::StrJoin(c.args, " ") << " exit " << r.exit_code << "\n"
                                                      << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << absl::StrJoin(c.args, " ") << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(JoinPath(tmp.path(), "unused")));  // refused before the state dir
  CommandResult tls =
      run({"--listen", "127.0.0.1:0", "--metrics-listen", "off", "--tls-cert", cert, "--tls-key", cert});
  EXPECT_EQ(tls.exit_code, 1) << tls.output;
  EXPECT_NE(tls.output.find("holds no PEM certificate"), std::string::npos) << tls.output;

  testing::CoordinatorProcess first(tmp.Sub("first"));
  absl::StatusOr<CommandResult> second = RunCommand({testing::BinaryPath("dtcoord"), "--listen", first.address(),
                                                     "--state-dir", tmp.Sub("second"), "--metrics-listen", "off"},
                                                    absl::Seconds(20));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->exit_code, 1) << second->output;  // not a crash, and not a second server on the port
  EXPECT_NE(second->output.find("the port is in use (another dtcoord?)"), std::string::npos) << second->output;
}

}  // namespace
}  // namespace dt

namespace dt {
namespace {

// A coordinator killed (or stopped with SIGTERM) and started again a second and a half later must
// find its ranks heartbeating again well within a short heartbeat timeout: their channels
// reconnect as soon as it listens. (They used to notice only when gRPC's backup poller ran, every
// 5 s: no thread waited on the channel while it was failing; found by scripts/chaos.sh.)
// A dtcoord process (heartbeat every 200 ms) and a one-node run of `ppn` registered agents that
// heartbeat each for its rank (dttrainer) or on one stream for the node (dtrun), counting how
// often they were told to stop.
class HeartbeatingRun {
 public:
  HeartbeatingRun(const std::string& name, int ppn, const std::string& heartbeat_timeout, bool node_stream)
      : coord(tmp.path(), {"--heartbeat-interval", "200ms", "--heartbeat-timeout", heartbeat_timeout}),
        run(coord.Submit(testing::MakeSpec(name, tmp.Sub("runs"), 1, ppn))),
        agents(testing::RegisterAgents(coord.Client(run.run_token()), run.run_id(), "n1", ppn)) {
    auto on_stop = [this](const std::string&) { ++stops; };
    if (node_stream) {
      std::vector<Agent*> raw;
      for (const auto& a : agents) raw.push_back(a.get());
      node_ = std::make_unique<NodeHeartbeats>(raw, on_stop);
      return;
    }
    for (const auto& a : agents) a->StartHeartbeats(on_stop);
  }
  ~HeartbeatingRun() {
    if (node_) node_->Stop();
    for (const auto& a : agents) a->StopHeartbeats();
  }

  testing::TempDir tmp;
  testing::CoordinatorProcess coord;
  v1::SubmitRunResponse run;
  std::vector<std::unique_ptr<Agent>> agents;
  std::atomic<int> stops{0};

 private:
  std::unique_ptr<NodeHeartbeats> node_;
};

TEST(CoordinatorRestartTest, RanksReconnectWithinAShortHeartbeatTimeout) {
  for (bool node_stream : {false, true}) {
    for (int sig : {SIGKILL, SIGTERM}) {
      HeartbeatingRun r("reconnect", 2, "3s", node_stream);
      auto& coord = r.coord;
      auto& run = r.run;
      auto& stops = r.stops;
      ASSERT_TRUE(
          testing::WaitFor([&] { return coord.GetRun(run.run_id()).state() == v1::RUNNING; }, absl::Seconds(5)));
      coord.StopAndRestart(sig, absl::Milliseconds(1500));
      // Longer than the heartbeat timeout the restarted coordinator allows its ranks to come back in.
      absl::SleepFor(absl::Seconds(5));
      v1::Run now = coord.GetRun(run.run_id());
      EXPECT_EQ(now.state(), v1::RUNNING) << (node_stream ? "node stream" : "per rank") << ", after " << strsignal(sig)
                                          << ": " << now.reason().message();
      EXPECT_EQ(stops.load(), 0);
    }
  }
}

// Ranks of one node share barrier outcomes through the node relay: the coordinator answers the
// node's first arrival only. A kill -9 of the coordinator while two of three ranks wait must not
// strand the member waiting in shared memory: both arrive again and every rank is released.
void RelayedBarrierAcrossAKillNine(bool node_stream);

TEST(CoordinatorRestartTest, RelayedBarrierWaitersArriveAgainAfterAKillNine) {
  for (bool node_stream : {false, true}) {
    SCOPED_TRACE(node_stream ? "node stream" : "per rank");
    RelayedBarrierAcrossAKillNine(node_stream);
  }
}

void RelayedBarrierAcrossAKillNine(bool node_stream) {
  HeartbeatingRun r("relay-restart", 3, "5s", node_stream);
  auto& coord = r.coord;
  auto& run = r.run;
  auto& agents = r.agents;
  auto& stops = r.stops;
  std::vector<absl::Status> results(3);
  std::vector<std::thread> waiting;
  for (int r = 0; r < 2; ++r) {
    waiting.emplace_back([&, r] { results[r] = agents[r]->Barrier("after-restart", absl::Seconds(60)); });
  }
  // Both arrivals are counted (one holds, one is a member waiting in shared memory), then the kill.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        v1::Run now = coord.GetRun(run.run_id());
        return now.open_barriers_size() == 1 && now.open_barriers(0).arrived() == 2 &&
               now.open_barriers(0).missing_ranks_size() == 1 && now.open_barriers(0).missing_ranks(0) == 2;
      },
      absl::Seconds(10)));
  absl::Time start = absl::Now();
  coord.StopAndRestart(SIGKILL);
  results[2] = agents[2]->Barrier("after-restart", absl::Seconds(60));
  for (auto& t : waiting) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "released by arriving again, not by a timeout";
  EXPECT_EQ(stops.load(), 0);
}

// gRPC 1.51's two callback threads each sleep 100 ms after a second without work, and they go
// idle together, so a call that came just after a second of quiet waited for them (dtctl submit:
// 84-104 ms against 30-40 ms). The server's keeper (coordinator/callback_queue_keeper.h) keeps one
// of them looking. The sleep below is the quiet under test, not a wait for something to happen.
TEST_F(IntegrationTest, ACallAfterAQuietSecondIsAnsweredWithoutWaitingForGrpcsIdleThreads) {
  ASSERT_TRUE(
      Call(*admin_, &v1::RunService::Stub::ListRuns, admin_->runs(), v1::ListRunsRequest(), absl::Seconds(5)).ok());
  std::vector<double> ms;
  for (int i = 0; i < 7; ++i) {
    absl::SleepFor(absl::Milliseconds(1020));
    absl::Time start = absl::Now();
    ASSERT_TRUE(
        Call(*admin_, &v1::RunService::Stub::ListRuns, admin_->runs(), v1::ListRunsRequest(), absl::Seconds(5)).ok());
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  // Without the keeper each of these calls waited 70-90 ms; answered at once they take about one.
  EXPECT_LT(sorted[sorted.size() / 2], 40.0) << "call times (ms): " << absl::StrJoin(ms, ", ");
}

}  // namespace
}  // namespace dt
