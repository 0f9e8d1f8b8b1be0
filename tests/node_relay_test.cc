// The node relay's shared memory, across real processes: an outcome published by one process
// reaches a waiter in another (before or after it starts waiting), failures keep their code and
// message, waits end at their deadline or when interrupted, slots are reused, and nothing is left
// in /dev/shm once every rank of the node has the segment mapped.
#include "client/node_relay.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "tests/test_util.h"

namespace dt {
namespace {

bool ShmExists(const std::string& name) { return std::filesystem::exists("/dev/shm/" + name); }

absl::Status NeverInterrupted() { return absl::OkStatus(); }

std::string FreshRun() { return "r-test-" + RandomHex(6); }

// Forks a process that opens the relay, arrives at instance 1 of barrier "t", writes its role to
// `arrived` ("member"/"holder"), waits as a member and writes "<code> <sequence> <message>".
std::pair<pid_t, int> ForkMember(const std::string& run, int* arrived) {
  int out_fds[2], arrived_fds[2];
  EXPECT_EQ(::pipe(out_fds), 0);
  EXPECT_EQ(::pipe(arrived_fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out_fds[0]);
    ::close(arrived_fds[0]);
    std::string out;
    auto relay = NodeRelay::Open(run, 0, "node-a", 2);
    if (!relay.ok()) ::_exit(1);
    NodeRelay::Ticket ticket = (*relay)->Arrive("t", 1, 1);
    std::string role = ticket.role == NodeRelay::Role::kMember ? "member" : "holder";
    (void)!::write(arrived_fds[1], role.data(), role.size());
    ::close(arrived_fds[1]);
    if (ticket.role == NodeRelay::Role::kMember) {
      auto r = (*relay)->Wait(ticket, absl::Now() + absl::Seconds(20), "barrier \"t\"", NeverInterrupted);
      if (!r.ok()) {
        out = absl::StrCat(static_cast<int>(r.status().code()), " 0 ", r.status().message());
      } else {
        out = absl::StrCat(static_cast<int>(r->status.code()), " ", r->sequence, " ", r->status.message());
      }
    }
    (void)!::write(out_fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(out_fds[1]);
  ::close(arrived_fds[1]);
  *arrived = arrived_fds[0];
  return {pid, out_fds[0]};
}

TEST(NodeRelayTest, TheFirstArrivalHoldsAndItsReleaseWakesAMemberInAnotherProcess) {
  std::string run = FreshRun();
  auto relay = NodeRelay::Open(run, 0, "node-a", 2);
  ASSERT_TRUE(relay.ok()) << relay.status();
  NodeRelay::Ticket holder = (*relay)->Arrive("t", 1, 0);
  EXPECT_EQ(holder.role, NodeRelay::Role::kHolder);
  int arrived;
  auto [pid, fd] = ForkMember(run, &arrived);
  EXPECT_EQ(testing::ReadToEnd(arrived), "member");
  (*relay)->Publish(holder, RelayOutcome{absl::OkStatus(), 1});
  EXPECT_EQ(testing::ReadToEnd(fd), "0 1 ");
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_FALSE(ShmExists((*relay)->name())) << "both ranks opened it: the name is gone";
  // Every reader read it: the instance's slot is free, the next arrival holds a new one.
  EXPECT_EQ((*relay)->Arrive("t", 1, 0).role, NodeRelay::Role::kHolder);
}

TEST(NodeRelayTest, AFailureReachesMembersArrivedBeforeAndAfterItsPublication) {
  std::string run = FreshRun();
  auto a = NodeRelay::Open(run, 0, "node-a", 3);
  auto b = NodeRelay::Open(run, 0, "node-a", 3);
  auto c = NodeRelay::Open(run, 0, "node-a", 3);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  NodeRelay::Ticket holder = (*a)->Arrive("ckpt", 4, 0);
  NodeRelay::Ticket early = (*b)->Arrive("ckpt", 4, 1);
  ASSERT_EQ(early.role, NodeRelay::Role::kMember);
  (*a)->Publish(holder, RelayOutcome{absl::DeadlineExceededError("missing 1: rank 3 (node b)"), 4});
  NodeRelay::Ticket late = (*c)->Arrive("ckpt", 4, 2);  // a straggler, after the timeout
  ASSERT_EQ(late.role, NodeRelay::Role::kMember);
  for (auto [relay, ticket] : {std::pair{b->get(), early}, std::pair{c->get(), late}}) {
    auto r = relay->Wait(ticket, absl::Now() + absl::Seconds(5), "barrier \"ckpt\"", NeverInterrupted);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(r->status.message(), "missing 1: rank 3 (node b)");
  }
  EXPECT_EQ((*a)->Arrive("ckpt", 4, 0).role, NodeRelay::Role::kHolder) << "both read it: the slot is free";
}

TEST(NodeRelayTest, TheNodesLastArrivalCarriesTheArrivalsHeldBackBeforeIt) {
  std::string run = FreshRun();
  std::vector<std::unique_ptr<NodeRelay>> ranks;
  for (int r = 0; r < 4; ++r) {
    auto opened = NodeRelay::Open(run, 0, "node-a", 4);
    ASSERT_TRUE(opened.ok()) << opened.status();
    ranks.push_back(std::move(*opened));
  }
  NodeRelay::Ticket first_holder = ranks[0]->Arrive("step", 1, 10);
  EXPECT_EQ(first_holder.role, NodeRelay::Role::kHolder);
  EXPECT_FALSE(first_holder.held_back);
  NodeRelay::Ticket second = ranks[1]->Arrive("step", 1, 11);
  NodeRelay::Ticket third = ranks[2]->Arrive("step", 1, 12);
  EXPECT_TRUE(second.held_back && third.held_back) << "they send nothing: the last arrival will";
  NodeRelay::Ticket last = ranks[3]->Arrive("step", 1, 13);
  EXPECT_FALSE(last.held_back);
  std::sort(last.carry.begin(), last.carry.end());
  EXPECT_EQ(last.carry, (std::vector<int32_t>{11, 12}));
  EXPECT_FALSE(ranks[1]->SendHeldBack(second, 11)) << "carried already: nothing left to send";

  // A late last arrival: a member takes its arrival back and sends it itself; the last one then
  // carries only those still held back.
  NodeRelay::Ticket second_holder = ranks[0]->Arrive("step", 2, 10);
  second = ranks[1]->Arrive("step", 2, 11);
  third = ranks[2]->Arrive("step", 2, 12);
  EXPECT_TRUE(ranks[1]->SendHeldBack(second, 11));
  EXPECT_FALSE(ranks[1]->SendHeldBack(second, 11)) << "only once";
  last = ranks[3]->Arrive("step", 2, 13);
  EXPECT_EQ(last.carry, (std::vector<int32_t>{12}));

  // Every member, carried or not, still learns the outcome from the holder.
  ranks[0]->Publish(first_holder, RelayOutcome{absl::OkStatus(), 1});
  ranks[0]->Publish(second_holder, RelayOutcome{absl::OkStatus(), 2});
  for (int r = 1; r < 4; ++r) {
    NodeRelay::Ticket member;
    member.role = NodeRelay::Role::kMember;
    member.slot = second_holder.slot;
    auto outcome = ranks[r]->Wait(member, absl::Now() + absl::Seconds(5), "barrier \"step\"", NeverInterrupted);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->sequence, 2u);
  }
}

TEST(NodeRelayTest, MembersSendTheirOwnArrivalWhileNotEveryRankOfTheNodeUsesTheRelay) {
  std::string run = FreshRun();
  auto a = NodeRelay::Open(run, 0, "node-a", 3);
  auto b = NodeRelay::Open(run, 0, "node-a", 3);  // the third rank (say, Python's dt.barrier) never opens it
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->Arrive("x", 1, 0).role, NodeRelay::Role::kHolder);
  NodeRelay::Ticket member = (*b)->Arrive("x", 1, 1);
  EXPECT_EQ(member.role, NodeRelay::Role::kMember);
  EXPECT_FALSE(member.held_back) << "nobody would carry it";
  EXPECT_TRUE(member.carry.empty());
  (*a)->Unlink();
}

TEST(NodeRelayTest, NodesAndGenerationsHaveTheirOwnSegments) {
  std::string run = FreshRun();
  auto a = NodeRelay::Open(run, 0, "node-a", 3);
  auto b = NodeRelay::Open(run, 0, "node-a", 3);
  auto other_node = NodeRelay::Open(run, 0, "node-b", 3);
  ASSERT_TRUE(a.ok() && b.ok() && other_node.ok());
  EXPECT_EQ((*a)->Arrive("x", 1, 0).role, NodeRelay::Role::kHolder);
  EXPECT_EQ((*b)->Arrive("x", 1, 1).role, NodeRelay::Role::kMember);
  EXPECT_EQ((*other_node)->Arrive("x", 1, 0).role, NodeRelay::Role::kHolder);
  EXPECT_EQ((*a)->Arrive("y", 1, 0).role, NodeRelay::Role::kHolder);
  EXPECT_EQ((*a)->Arrive("x", 2, 0).role, NodeRelay::Role::kHolder);
  EXPECT_TRUE(ShmExists((*a)->name())) << "two of three ranks opened it";
  // The next generation's first opener removes this run's earlier segments on the node.
  auto next = NodeRelay::Open(run, 1, "node-a", 3);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ((*next)->Arrive("x", 1, 0).role, NodeRelay::Role::kHolder);
  EXPECT_FALSE(ShmExists((*a)->name()));
  EXPECT_TRUE(ShmExists((*other_node)->name()));
  (*other_node)->Unlink();
  (*next)->Unlink();
}

TEST(NodeRelayTest, AWaitEndsAtItsDeadlineWhenInterruptedAndWhenTheAgentStops) {
  std::string run = FreshRun();
  auto relay = NodeRelay::Open(run, 0, "node-a", 1);
  ASSERT_TRUE(relay.ok());
  (*relay)->Arrive("x", 1, 0);
  NodeRelay::Ticket member = (*relay)->Arrive("x", 1, 1);
  ASSERT_EQ(member.role, NodeRelay::Role::kMember);
  auto late =
      (*relay)->Wait(member, absl::Now() + absl::Milliseconds(100), "barrier \"x\" (instance 1)", NeverInterrupted);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("barrier \"x\" (instance 1)"), std::string::npos) << late.status();

  auto stopped = (*relay)->Wait(member, absl::Now() + absl::Seconds(20), "barrier \"x\"",
                                [] { return absl::AbortedError("this rank was told to stop"); });
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kAborted);

  absl::Time start = absl::Now();
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*relay)->InterruptWaiters();
  });
  auto interrupted =
      (*relay)->Wait(member, absl::Now() + absl::Seconds(20), "barrier \"x\"", NeverInterrupted, absl::Seconds(10));
  interrupter.join();
  EXPECT_EQ(interrupted.status().code(), absl::StatusCode::kUnavailable) << interrupted.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "woken, not polled";
}

TEST(NodeRelayTest, SlotsAreReusedAndAFullTableSendsRanksDirect) {
  std::string run = FreshRun();
  auto relay = NodeRelay::Open(run, 0, "node-a", 1);
  ASSERT_TRUE(relay.ok());
  for (uint64_t seq = 1; seq <= 500; ++seq) {
    NodeRelay::Ticket holder = (*relay)->Arrive("step", seq, 0);
    NodeRelay::Ticket member = (*relay)->Arrive("step", seq, 1);
    ASSERT_EQ(holder.role, NodeRelay::Role::kHolder) << seq;
    (*relay)->Publish(holder, RelayOutcome{absl::OkStatus(), seq});
    auto r = (*relay)->Wait(member, absl::Now() + absl::Seconds(5), "barrier \"step\"", NeverInterrupted);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->sequence, seq);
  }
  // Instances nobody publishes (open barriers) fill the table; a rank past that goes direct.
  int holders = 0;
  NodeRelay::Ticket t;
  for (int i = 0; (t = (*relay)->Arrive(absl::StrCat("open-", i), 1, 0)).role == NodeRelay::Role::kHolder; ++i)
    ++holders;
  EXPECT_EQ(t.role, NodeRelay::Role::kDirect);
  EXPECT_GE(holders, 16);
}

}  // namespace
}  // namespace dt
