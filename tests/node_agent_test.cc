// A node agent speaking for its node's ranks (RegisterNode, NodeHeartbeat), on the coordinator's
// logic without a network: the same seats and health as per-rank calls, one call per node.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/node_registration.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_monitor.h"
#include "coordinator/rank_registration.h"
#include "tests/coordinator_fixture.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorTest;
using testing::Reply;

class NodeAgentTest : public CoordinatorTest {
 protected:
  // Node `node`'s slots, in the order given; incarnations "<node>-<slot>" as RegisterRequest's.
  v1::RegisterNodeRequest NodeRequest(const std::string& run, const std::string& node, const std::vector<int>& slots) {
    v1::RegisterNodeRequest req;
    req.set_run_id(run);
    req.set_node(node);
    req.set_host("host-" + node);
    for (int slot : slots) {
      v1::NodeSlot& s = *req.add_slots();
      s.set_local_slot(slot);
      s.set_incarnation(absl::StrCat(node, "-", slot));
      s.set_pid(1000 + slot);
    }
    return req;
  }

  // Heartbeats for `ranks` of generation 0 at `step`, with the incarnations RegisterAllNodes gave.
  absl::StatusOr<v1::NodeHeartbeatResponse> Beat(const std::string& run, int ppn, const std::vector<int>& ranks,
                                                 int64_t step) {
    v1::NodeHeartbeatRequest req;
    req.set_run_id(run);
    for (int rank : ranks) {
      v1::RankHeartbeat& b = *req.add_ranks();
      b.set_rank(rank);
      b.set_incarnation(absl::StrCat("n", rank / ppn + 1, "-", rank % ppn));
      b.set_step(step);
    }
    return coord_->health().NodeHeartbeat(req);
  }

  // Every node of a nodes × ppn run registers through its agent; their replies.
  std::vector<v1::RegisterNodeResponse> RegisterAllNodes(const std::string& run, int nodes, int ppn) {
    std::vector<std::unique_ptr<Reply<v1::RegisterNodeResponse>>> replies;
    std::vector<int> slots;
    for (int s = 0; s < ppn; ++s) slots.push_back(s);
    for (int n = 0; n < nodes; ++n) {
      replies.push_back(std::make_unique<Reply<v1::RegisterNodeResponse>>());
      coord_->registration().RegisterNode(NodeRequest(run, absl::StrCat("n", n + 1), slots), replies.back()->pending());
    }
    std::vector<v1::RegisterNodeResponse> out;
    for (auto& r : replies) {
      EXPECT_TRUE(r->arrived());
      EXPECT_TRUE(r->value.ok()) << r->value.status();
      out.push_back(r->value.ok() ? *r->value : v1::RegisterNodeResponse());
    }
    return out;
  }
};

// The agent packs its slots' Register calls into one; dtcoord unpacks each: every field of every
// slot must come out as it went in, and each slot's answer as Register would have given it.
TEST(NodeRegistrationTest, EachSlotsRequestAndAnswerSurviveThePacking) {
  std::vector<v1::RegisterRequest> slots(3);
  for (int i = 0; i < 3; ++i) {
    v1::RegisterRequest& r = slots[i];
    r.set_run_id("r-1");
    r.set_node("n7");
    r.set_host("h7");
    r.mutable_expected()->set_world_size(24);
    r.set_version("1.2.3");
    r.set_local_slot(2 - i);
    r.set_incarnation(absl::StrCat("inc-", i));
    r.set_pid(500 + i);
    if (i != 1) r.set_scheduler_task(40 + i);
    r.set_captures_stacks(i == 2);
  }
  v1::RegisterNodeRequest packed = PackNodeRegistration(slots);
  ASSERT_EQ(packed.slots_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(SlotRegistration(packed, i).SerializeAsString(), slots[i].SerializeAsString())
        << "slot " << i << ": " << SlotRegistration(packed, i).ShortDebugString();
  }

  v1::RegisterResponse shared;
  shared.set_world_size(24);
  shared.set_local_world_size(3);
  shared.set_node_rank(6);
  shared.set_nodes(8);
  shared.set_generation(2);
  shared.set_exp_dir("/exp/r-1");
  shared.mutable_resume()->set_step(100);
  shared.mutable_spec()->set_nodes(8);
  shared.mutable_timeouts()->set_heartbeat_interval_ms(2000);
  shared.set_restarts(1);
  shared.set_run_id("r-1");
  std::vector<v1::RegisterNodeResponse::SlotRank> ranks(3);
  for (int i = 0; i < 3; ++i) {
    ranks[i].set_local_slot(2 - i);
    ranks[i].set_local_rank(2 - i);
    ranks[i].set_rank(18 + 2 - i);
  }
  v1::RegisterNodeResponse answer = PackNodeAnswer(shared, ranks);
  for (int i = 0; i < 3; ++i) {
    v1::RegisterResponse expected = shared;
    expected.set_rank(18 + 2 - i);
    expected.set_local_rank(2 - i);
    EXPECT_EQ(SlotAnswer(answer, i).SerializeAsString(), expected.SerializeAsString())
        << "slot " << i << ": " << SlotAnswer(answer, i).ShortDebugString();
  }
}

TEST_F(NodeAgentTest, ANodesAgentGetsTheSeatsItsRanksWouldHaveGotOneByOne) {
  std::string run = Submit(3, 4);
  Reply<v1::RegisterNodeResponse> agent;
  coord_->registration().RegisterNode(NodeRequest(run, "n2", {3, 1, 0, 2}), agent.pending());
  std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> singles;
  for (const char* node : {"n1", "n3"}) {
    for (int slot = 0; slot < 4; ++slot) {
      singles.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
      coord_->registration().Register(RegisterRequest(run, node, slot), singles.back()->pending());
      if (!(node == std::string("n3") && slot == 3)) {
        EXPECT_FALSE(agent.arrived()) << "the agent was answered before every rank came";
      }
    }
  }
  ASSERT_TRUE(agent.arrived());
  ASSERT_TRUE(agent.value.ok()) << agent.value.status();
  const v1::RegisterNodeResponse& node = *agent.value;
  EXPECT_EQ(node.world_size(), 12);
  EXPECT_EQ(node.nodes(), 3);
  EXPECT_EQ(node.node_rank(), 1);
  EXPECT_EQ(node.local_world_size(), 4);
  EXPECT_EQ(node.generation(), 0);
  EXPECT_EQ(node.run_id(), run);
  EXPECT_EQ(node.spec().nodes(), 3);
  EXPECT_GT(node.timeouts().heartbeat_interval_ms(), 0);
  ASSERT_EQ(node.slots_size(), 4);
  const std::vector<int> order = {3, 1, 0, 2};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(node.slots(i).local_slot(), order[i]);
    EXPECT_EQ(node.slots(i).local_rank(), order[i]);
    EXPECT_EQ(node.slots(i).rank(), 4 + order[i]);
  }
  for (auto& single : singles) {
    ASSERT_TRUE(single->value.ok()) << single->value.status();
    EXPECT_TRUE(single->value->rank() < 4 || single->value->rank() >= 8) << single->value->rank();
  }
  auto status = coord_->GetRun(run);
  ASSERT_EQ(status->ranks_size(), 12);
  EXPECT_EQ(status->ranks(5).node(), "n2");
  EXPECT_EQ(status->ranks(5).pid(), 1001);
  EXPECT_EQ(status->ranks(5).incarnation(), "n2-1");
  EXPECT_EQ(State(run), v1::RUNNING);
}

TEST_F(NodeAgentTest, NodeHeartbeatsKeepEveryRankAliveAndASilentNodeFailsTheGeneration) {
  std::string run = Submit(3, 2);
  RegisterAllNodes(run, 3, 2);
  for (int beat = 1; beat <= 10; ++beat) {
    Advance(absl::Seconds(10));
    for (std::vector<int> ranks : {std::vector<int>{0, 1}, std::vector<int>{2, 3}}) {
      absl::StatusOr<v1::NodeHeartbeatResponse> out = Beat(run, 2, ranks, beat);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->ranks_size(), 2);
      for (const auto& answer : out->ranks()) {
        if (beat <= 2) {
          EXPECT_EQ(answer.code(), 0) << answer.message();
        }
      }
    }
    if (beat <= 2) {
      ASSERT_TRUE(Beat(run, 2, {4, 5}, beat).ok());
    }
  }
  // Node n3 fell silent after 20 s; the heartbeat timeout is 30 s.
  EXPECT_EQ(State(run), v1::FAILED);
  const v1::Failure reason = coord_->GetRun(run)->reason();
  EXPECT_EQ(reason.node(), "n3") << reason.DebugString();
  EXPECT_TRUE(reason.rank() == 4 || reason.rank() == 5) << reason.DebugString();
  // After the generation ended, each rank's answer says STOP.
  absl::StatusOr<v1::NodeHeartbeatResponse> after = Beat(run, 2, {0, 1}, 11);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->ranks(0).reply().directive(), v1::HeartbeatResponse::STOP);
  EXPECT_EQ(after->ranks(1).reply().directive(), v1::HeartbeatResponse::STOP);
}

TEST_F(NodeAgentTest, EachRankOfANodeHeartbeatGetsItsOwnAnswer) {
  std::string run = Submit(1, 3);
  RegisterAllNodes(run, 1, 3);
  v1::NodeHeartbeatRequest req;
  req.set_run_id(run);
  for (int rank : {2, 0, 1}) {
    v1::RankHeartbeat& b = *req.add_ranks();
    b.set_rank(rank);
    b.set_incarnation(rank == 0 ? "an-older-process" : absl::StrCat("n1-", rank));
    b.set_step(7);
  }
  absl::StatusOr<v1::NodeHeartbeatResponse> out = coord_->health().NodeHeartbeat(req);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->ranks_size(), 3);
  EXPECT_EQ(out->ranks(0).rank(), 2);
  EXPECT_EQ(out->ranks(0).code(), 0);
  EXPECT_EQ(out->ranks(0).reply().directive(), v1::HeartbeatResponse::CONTINUE);
  EXPECT_EQ(out->ranks(1).rank(), 0);
  EXPECT_EQ(out->ranks(1).code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_NE(out->ranks(1).message().find("was replaced"), std::string::npos) << out->ranks(1).message();
  EXPECT_EQ(out->ranks(2).code(), 0);
  // A rank outside the run is that rank's error, not the call's.
  req.mutable_ranks(1)->set_rank(9);
  out = coord_->health().NodeHeartbeat(req);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->ranks(1).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(out->ranks(2).code(), 0);
  // Malformed calls are refused whole, naming the fault.
  req.mutable_ranks(2)->set_rank(2);
  absl::StatusOr<v1::NodeHeartbeatResponse> twice = coord_->health().NodeHeartbeat(req);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("rank 2 is given twice"), std::string::npos) << twice.status();
  v1::NodeHeartbeatRequest none;
  none.set_run_id(run);
  EXPECT_EQ(coord_->health().NodeHeartbeat(none).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NodeAgentTest, ARetryGetsTheSameSeatsAndARestartedSlotStartsTheNextGeneration) {
  std::string run = Submit(2, 2, /*max_restarts=*/1);
  RegisterAllNodes(run, 2, 2);
  Reply<v1::RegisterNodeResponse> retry;
  coord_->registration().RegisterNode(NodeRequest(run, "n2", {1, 0}), retry.pending());
  ASSERT_TRUE(retry.arrived());
  ASSERT_TRUE(retry.value.ok()) << retry.value.status();
  EXPECT_EQ(retry.value->slots(0).local_slot(), 1);
  EXPECT_EQ(retry.value->slots(0).rank(), 3);
  EXPECT_EQ(retry.value->slots(1).local_slot(), 0);
  EXPECT_EQ(retry.value->slots(1).rank(), 2);
  EXPECT_EQ(retry.value->generation(), 0);
  EXPECT_EQ(State(run), v1::RUNNING);

  v1::RegisterNodeRequest restarted = NodeRequest(run, "n2", {0, 1});
  restarted.mutable_slots(1)->set_incarnation("n2-1-restarted");
  Reply<v1::RegisterNodeResponse> next;
  coord_->registration().RegisterNode(restarted, next.pending());
  EXPECT_FALSE(next.arrived()) << "the restarted node joins generation 1, which waits for n1";
  auto status = coord_->GetRun(run);
  EXPECT_EQ(status->generation(), 1);
  Reply<v1::RegisterNodeResponse> n1;
  coord_->registration().RegisterNode(NodeRequest(run, "n1", {0, 1}), n1.pending());
  ASSERT_TRUE(next.arrived() && n1.arrived());
  ASSERT_TRUE(next.value.ok()) << next.value.status();
  EXPECT_EQ(next.value->generation(), 1);
  EXPECT_EQ(next.value->slots(1).rank(), 3);
}

TEST_F(NodeAgentTest, AMalformedOrMisfitNodeRegistrationIsRefusedAndSeatsNothing) {
  std::string run = Submit(2, 2);
  auto refused = [&](const v1::RegisterNodeRequest& req) {
    Reply<v1::RegisterNodeResponse> r;
    coord_->registration().RegisterNode(req, r.pending());
    EXPECT_TRUE(r.arrived());
    return r.value.status();
  };
  absl::Status none = refused(NodeRequest(run, "n1", {}));
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("1..1024 slots, not 0"), std::string::npos) << none;
  absl::Status twice = refused(NodeRequest(run, "n1", {0, 1, 0}));
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("slot 0 is given twice"), std::string::npos) << twice;
  v1::RegisterNodeRequest bad_incarnation = NodeRequest(run, "n1", {0, 1});
  bad_incarnation.mutable_slots(1)->set_incarnation("");
  absl::Status named = refused(bad_incarnation);
  EXPECT_EQ(named.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(named.message().find("slot 1: "), std::string::npos) << named;
  // Slot 2 does not exist in a 2-per-node run: slots 0 and 1 of the same call are not seated
  // either.
  absl::Status outside = refused(NodeRequest(run, "n1", {0, 1, 2}));
  EXPECT_EQ(outside.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(outside.message().find("local slot 2"), std::string::npos) << outside;
  EXPECT_EQ(coord_->GetRun(run)->ranks_size(), 0) << "a refused call left registrants waiting";
  // A third node in a two-node run, while two wait: refused, and none of its slots is seated.
  Reply<v1::RegisterNodeResponse> n1;
  coord_->registration().RegisterNode(NodeRequest(run, "n1", {0, 1}), n1.pending());
  Reply<v1::RegisterResponse> n2_first;
  coord_->registration().Register(RegisterRequest(run, "n2", 0), n2_first.pending());
  absl::Status third = refused(NodeRequest(run, "n3", {0, 1}));
  EXPECT_EQ(third.code(), absl::StatusCode::kFailedPrecondition) << third;
  EXPECT_NE(third.message().find("node 3 of a 2-node run"), std::string::npos) << third;
  EXPECT_EQ(coord_->GetRun(run)->ranks_size(), 3);
  Reply<v1::RegisterResponse> n2_second;
  coord_->registration().Register(RegisterRequest(run, "n2", 1), n2_second.pending());
  ASSERT_TRUE(n1.arrived() && n2_first.arrived() && n2_second.arrived());
  EXPECT_TRUE(n1.value.ok() && n2_first.value.ok() && n2_second.value.ok());
}

// An agent's retry whose later slot is still held by its earlier call: the retry's first slot
// fills the rendezvous, which is assigned only once the whole call is seated, so every slot of
// the retry gets its seat (and the earlier call is told it was replaced).
TEST_F(NodeAgentTest, ARetryThatFillsTheRendezvousGetsEverySlotSeated) {
  std::string run = Submit(2, 2);
  Reply<v1::RegisterNodeResponse> n2;
  coord_->registration().RegisterNode(NodeRequest(run, "n2", {0, 1}), n2.pending());
  Reply<v1::RegisterResponse> held;
  coord_->registration().Register(RegisterRequest(run, "n1", 1), held.pending());
  Reply<v1::RegisterNodeResponse> retry;
  coord_->registration().RegisterNode(NodeRequest(run, "n1", {0, 1}), retry.pending());
  ASSERT_TRUE(retry.arrived());
  ASSERT_TRUE(retry.value.ok()) << retry.value.status();
  ASSERT_EQ(retry.value->slots_size(), 2);
  EXPECT_EQ(retry.value->slots(0).rank(), 0);
  EXPECT_EQ(retry.value->slots(1).rank(), 1);
  EXPECT_EQ(held.value.status().code(), absl::StatusCode::kCancelled) << held.value.status();
  ASSERT_TRUE(n2.arrived() && n2.value.ok());
  EXPECT_EQ(State(run), v1::RUNNING);
}

// One slot's wait ends (another call took it over): the call ends, and its other slots leave the
// rendezvous instead of holding seats nobody will answer for.
TEST_F(NodeAgentTest, WhenOneSlotIsTakenOverTheCallsOtherSlotsLeaveWithIt) {
  std::string run = Submit(1, 3);
  Reply<v1::RegisterNodeResponse> first;
  coord_->registration().RegisterNode(NodeRequest(run, "n1", {0, 1}), first.pending());
  Reply<v1::RegisterResponse> newer;
  coord_->registration().Register(RegisterRequest(run, "n1", 1, "a-restarted-process"), newer.pending());
  ASSERT_TRUE(first.arrived());
  EXPECT_EQ(first.value.status().code(), absl::StatusCode::kAborted) << first.value.status();
  auto status = coord_->GetRun(run);
  ASSERT_EQ(status->ranks_size(), 1) << status->DebugString();
  EXPECT_EQ(status->ranks(0).incarnation(), "a-restarted-process");
}

TEST_F(NodeAgentTest, AnAgentThatWentAwayLeavesTheRendezvousWithAllItsSlots) {
  std::string run = Submit(1, 3);
  Reply<v1::RegisterNodeResponse> gone;
  PendingPtr<v1::RegisterNodeResponse> call = gone.pending();
  coord_->registration().RegisterNode(NodeRequest(run, "n1", {0, 1}), call);
  coord_->registration().WithdrawNodeRegistration(NodeRequest(run, "n1", {0, 1}), call.get());
  Reply<v1::RegisterNodeResponse> last;
  coord_->registration().RegisterNode(NodeRequest(run, "n1", {2}), last.pending());
  EXPECT_FALSE(last.arrived()) << "slots 0 and 1 left with their call";
  Advance(absl::Minutes(5) + absl::Seconds(1));
  ASSERT_TRUE(last.arrived());
  EXPECT_EQ(last.value.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string msg(last.value.status().message());
  EXPECT_NE(msg.find("1 of 3 registered"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing: n1/0, n1/1"), std::string::npos) << msg;
  // The transport answers a call that went away; the coordinator does not.
  EXPECT_FALSE(gone.arrived());
}

}  // namespace
}  // namespace dt
