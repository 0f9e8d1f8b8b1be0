// dtctl's reading of Slurm's node records: which nodes of a run count as failed.
#include "client/dtctl/node_failure.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace dt::ctl {
namespace {

google::protobuf::Timestamp At(absl::Time t) {
  google::protobuf::Timestamp out;
  out.set_seconds(absl::ToUnixSeconds(t));
  return out;
}

TEST(SlurmNode, ParsesStateStartTimeAndAReasonWithSpaces) {
  SlurmNode n = ParseSlurmNode(
      "NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 State=DOWN+NOT_RESPONDING "
      "ThreadsPerCore=1 BootTime=2026-11-23T08:58:00 SlurmdStartTime=2026-11-23T18:30:05 "
      "LastBusyTime=2026-11-23T18:31:00 Reason=Not responding [root@2026-11-23T18:32:00]\n");
  EXPECT_EQ(n.name, "n2");
  EXPECT_EQ(n.state, "DOWN+NOT_RESPONDING");
  EXPECT_EQ(n.reason, "Not responding [root@2026-11-23T18:32:00]");
  ASSERT_TRUE(n.slurmd_started.has_value());
  EXPECT_EQ(absl::FormatTime("%H:%M:%S", *n.slurmd_started, absl::LocalTimeZone()), "18:30:05");
  SlurmNode idle = ParseSlurmNode("NodeName=n1 State=IDLE SlurmdStartTime=None");
  EXPECT_EQ(idle.state, "IDLE");
  EXPECT_TRUE(idle.reason.empty());
  EXPECT_FALSE(idle.slurmd_started.has_value());
}

TEST(SlurmNode, OnlySlurmsEvidenceMakesANodeFailed) {
  absl::Time heard = absl::Now() - absl::Minutes(1);
  SlurmNode n{"n2", "ALLOCATED", "", heard - absl::Hours(1)};
  EXPECT_FALSE(NodeFailureEvidence(n, heard).has_value());  // busy and answering: alive
  n.state = "IDLE+DRAIN";
  n.reason = "bad DIMM";
  EXPECT_EQ(NodeFailureEvidence(n, heard).value_or(""), "Slurm reports it IDLE+DRAIN: bad DIMM");
  n.state = "MIXED+NOT_RESPONDING";
  EXPECT_TRUE(NodeFailureEvidence(n, heard).has_value());
  // Back in service, but its slurmd started after the run last heard from it: it went away.
  n = SlurmNode{"n2", "IDLE", "", heard + absl::Seconds(20)};
  std::optional<std::string> e = NodeFailureEvidence(n, heard);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->find("slurmd started again"), std::string::npos) << *e;
  EXPECT_FALSE(NodeFailureEvidence(n, absl::InfinitePast()).has_value());  // no time to compare with
}

TEST(SlurmNode, SuspectsAreTheRanksNodesAndSilentNodesNotYetExcluded) {
  absl::Time t = absl::Now();
  v1::Run run;
  for (const char* node : {"n1", "n1", "n2"}) {
    v1::RankStatus* r = run.add_ranks();
    r->set_node(node);
    *r->mutable_last_heartbeat() = At(t);
  }
  *run.mutable_ranks(0)->mutable_last_heartbeat() = At(t - absl::Seconds(30));
  v1::Failure* f = run.add_failures();
  f->set_kind(v1::Failure::HEARTBEAT_TIMEOUT);
  f->set_node("n7");
  *f->mutable_last_heard() = At(t - absl::Seconds(40));
  run.add_failures()->set_kind(v1::Failure::REPORTED_ERROR);
  run.mutable_failures(1)->set_node("n8");
  run.add_excluded_nodes("n2");
  std::map<std::string, absl::Time> s = SuspectNodes(run);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(absl::ToUnixSeconds(s["n1"]), absl::ToUnixSeconds(t));  // the latest of its ranks
  EXPECT_EQ(absl::ToUnixSeconds(s["n7"]), absl::ToUnixSeconds(t - absl::Seconds(40)));
}

}  // namespace
}  // namespace dt::ctl
