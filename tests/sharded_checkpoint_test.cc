// Sharded checkpoint rounds: every rank writes its own files into one round, the coordinator
// publishes them together or not at all.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/crypto.h"
#include "common/fs.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/checkpoint_shards.h"
#include "tests/coordinator_fixture.h"

namespace dt {
namespace {

namespace fs = std::filesystem;
using testing::CoordinatorTest;
using testing::Reply;

constexpr int kWorld = 4;

class ShardedRoundTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    run_ = coord_->SubmitRun(testing::MakeSpec("zero", save_dir_, 1, kWorld))->run_id();
    ranks_ = RegisterAll(run_, 1, kWorld);
  }

  v1::BeginCheckpointRequest BeginRequest(int rank, int64_t step, bool sharded) {
    v1::BeginCheckpointRequest req;
    req.set_run_id(run_);
    req.set_generation(0);
    req.set_rank(rank);
    req.set_step(step);
    req.set_sharded(sharded);
    return req;
  }

  // Every rank begins a sharded round at `step`; returns rank 0's view.
  v1::BeginCheckpointResponse Begin(int64_t step) {
    std::vector<std::unique_ptr<Reply<v1::BeginCheckpointResponse>>> replies;
    for (int r = 0; r < kWorld; ++r) {
      replies.push_back(std::make_unique<Reply<v1::BeginCheckpointResponse>>());
      coord_->checkpoints().Begin(BeginRequest(r, step, true), replies.back()->pending());
    }
    for (auto& r : replies) {
      EXPECT_TRUE(r->WaitFor());
      EXPECT_TRUE(r->value.ok()) << r->value.status();
      if (r->value.ok()) {
        EXPECT_EQ(r->value->partial_dir(), replies[0]->value->partial_dir());
      }
    }
    return replies[0]->value.value_or(v1::BeginCheckpointResponse());
  }

  // Writes `name` with `payload` into the round's directory; returns its manifest entry.
  static v1::ManifestFile Write(const std::string& dir, const std::string& name, const std::string& payload) {
    std::ofstream(JoinPath(dir, name), std::ios::binary) << payload;
    v1::ManifestFile f;
    f.set_name(name);
    f.set_size(static_cast<int64_t>(payload.size()));
    f.set_sha256(Sha256Hex(payload));
    return f;
  }

  void Commit(int rank, const v1::BeginCheckpointResponse& round, const v1::Manifest& m,
              Reply<v1::CommitCheckpointResponse>* out, const std::string& layout = "") {
    v1::CommitCheckpointRequest req;
    req.set_run_id(run_);
    req.set_generation(0);
    req.set_rank(rank);
    req.set_round_id(round.round_id());
    *req.mutable_manifest() = m;
    req.set_layout_json(layout);
    coord_->checkpoints().Commit(req, out->pending());
  }

  // A whole round at `step` where rank r writes shard-r.pt.
  void CommitAll(int64_t step) {
    v1::BeginCheckpointResponse round = Begin(step);
    Reply<v1::CommitCheckpointResponse> c[kWorld];
    for (int r = 0; r < kWorld; ++r) {
      v1::Manifest m;
      *m.add_files() = Write(round.partial_dir(), absl::StrCat("shard-", r, ".pt"), absl::StrCat(step, "/", r));
      Commit(r, round, m, &c[r]);
    }
    for (auto& reply : c) {
      ASSERT_TRUE(reply.WaitFor());
      ASSERT_TRUE(reply.value.ok()) << reply.value.status();
    }
  }

  std::string Latest() { return testing::LatestIn(ckpt_dir()); }
  std::string ckpt_dir() { return save_dir_ + "/zero/checkpoints"; }
  bool AnyPartial() { return testing::AnyPartialIn(ckpt_dir()); }

  std::string run_;
  std::vector<v1::RegisterResponse> ranks_;
};

TEST_F(ShardedRoundTest, EveryRanksFilesArePublishedInOneCheckpointWithTheirRanks) {
  v1::BeginCheckpointResponse round = Begin(10);
  EXPECT_TRUE(round.sharded());
  EXPECT_EQ(round.writer_rank(), -1);
  EXPECT_EQ(round.world_size(), kWorld);
  const std::string layout = R"({"optimizer": "zero1", "slices": [0, 10, 20, 30]})";
  Reply<v1::CommitCheckpointResponse> c[kWorld];
  for (int r = 0; r < 3; ++r) {  // rank 3 holds no state: its manifest is empty
    v1::Manifest m;
    *m.add_files() = Write(round.partial_dir(), absl::StrCat("optim-", r, ".pt"), absl::StrCat("slice ", r));
    if (r == 0) *m.add_files() = Write(round.partial_dir(), ".metadata", "plan");
    Commit(r, round, m, &c[r], r == 0 || r == 2 ? layout : "");
  }
  coord_->AwaitFileWork();
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(c[r].arrived()) << "published before rank 3 committed";
  EXPECT_EQ(Latest(), "");
  Commit(3, round, v1::Manifest(), &c[3]);
  for (auto& reply : c) {
    ASSERT_TRUE(reply.WaitFor());
    ASSERT_TRUE(reply.value.ok()) << reply.value.status();
  }
  const v1::CheckpointInfo& info = c[3].value->checkpoint();
  EXPECT_TRUE(info.sharded());
  EXPECT_EQ(info.writer_rank(), -1);
  EXPECT_EQ(info.world_size(), kWorld);
  ASSERT_EQ(info.shards_size(), 3);
  EXPECT_EQ(info.shards(0).rank(), 0);
  EXPECT_EQ(info.shards(0).files(), 2);
  EXPECT_EQ(info.shards(0).bytes(), 7 + 4);
  EXPECT_EQ(info.shards(2).rank(), 2);
  EXPECT_EQ(Latest(), "step-10");
  EXPECT_FALSE(AnyPartial());

  std::ifstream in(ckpt_dir() + "/step-10/manifest.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["world_size"], kWorld);
  EXPECT_EQ(doc["sharded"], true);
  EXPECT_EQ(doc["layout"], nlohmann::json::parse(layout));
  std::map<std::string, int> ranks;
  for (const auto& f : doc["files"]) ranks[f["name"].get<std::string>()] = f["rank"].get<int>();
  EXPECT_EQ(ranks,
            (std::map<std::string, int>{{".metadata", 0}, {"optim-0.pt", 0}, {"optim-1.pt", 1}, {"optim-2.pt", 2}}));

  auto list = coord_->checkpoints().List(run_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].shards_size(), 3);
}

TEST_F(ShardedRoundTest, TwoRanksClaimingOneFileAbortTheRoundNamingBoth) {
  ASSERT_NO_FATAL_FAILURE(CommitAll(5));
  v1::BeginCheckpointResponse round = Begin(10);
  v1::Manifest m0, m1;
  *m0.add_files() = Write(round.partial_dir(), "optim.pt", "mine");
  *m1.add_files() = m0.files(0);
  Reply<v1::CommitCheckpointResponse> c0, c1;
  Commit(0, round, m0, &c0);
  Commit(1, round, m1, &c1);
  ASSERT_TRUE(c1.WaitFor());
  EXPECT_EQ(c1.value.status().code(), absl::StatusCode::kInvalidArgument) << c1.value.status();
  EXPECT_NE(c1.value.status().message().find("\"optim.pt\" is claimed by rank 0 and by rank 1"), std::string::npos)
      << c1.value.status();
  ASSERT_TRUE(c0.WaitFor());
  EXPECT_EQ(c0.value.status().code(), absl::StatusCode::kAborted) << c0.value.status();
  EXPECT_NE(c0.value.status().message().find("claimed by rank 0 and by rank 1"), std::string::npos)
      << c0.value.status();
  coord_->AwaitFileWork();
  EXPECT_EQ(Latest(), "step-5");
  EXPECT_FALSE(AnyPartial());
  EXPECT_FALSE(fs::exists(ckpt_dir() + "/step-10"));
}

TEST_F(ShardedRoundTest, ARankThatDiesMidRoundLeavesNoCheckpointAndLatestUnchanged) {
  ASSERT_NO_FATAL_FAILURE(CommitAll(5));
  v1::BeginCheckpointResponse round = Begin(10);
  Reply<v1::CommitCheckpointResponse> c[3];
  for (int r = 0; r < 3; ++r) {
    v1::Manifest m;
    *m.add_files() = Write(round.partial_dir(), absl::StrCat("shard-", r), "x");
    Commit(r, round, m, &c[r]);
  }
  Write(round.partial_dir(), "shard-3", "half");  // rank 3 dies while writing
  for (int i = 0; i < 40 && !c[0].arrived(); ++i) {
    Advance(absl::Seconds(2));
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(Beat(run_, ranks_[r], 9).ok());
  }
  for (auto& reply : c) {
    ASSERT_TRUE(reply.WaitFor());
    EXPECT_EQ(reply.value.status().code(), absl::StatusCode::kAborted) << reply.value.status();
    EXPECT_NE(reply.value.status().message().find("rank 3"), std::string::npos) << reply.value.status();
  }
  EXPECT_EQ(Latest(), "step-5");
  EXPECT_FALSE(AnyPartial());
  EXPECT_FALSE(fs::exists(ckpt_dir() + "/step-10"));
}

TEST_F(ShardedRoundTest, ALapsedLeaseNamesTheRanksThatDidNotCommit) {
  v1::BeginCheckpointResponse round = Begin(10);
  Reply<v1::CommitCheckpointResponse> c0, c2;
  v1::Manifest m;
  *m.add_files() = Write(round.partial_dir(), "shard-0", "x");
  Commit(0, round, m, &c0);
  Commit(2, round, v1::Manifest(), &c2);
  for (int i = 0; i < 400 && !c0.arrived(); ++i) {
    Advance(absl::Seconds(2));
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(Beat(run_, ranks_[r], 9).ok());
  }
  ASSERT_TRUE(c0.WaitFor() && c2.WaitFor());
  EXPECT_EQ(c0.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(c0.value.status().message().find("ranks 1, 3 of the sharded round did not commit within the lease"),
            std::string::npos)
      << c0.value.status();
  EXPECT_FALSE(fs::exists(round.partial_dir()));
}

TEST_F(ShardedRoundTest, AnyRanksAbortEndsTheRound) {
  v1::BeginCheckpointResponse round = Begin(10);
  Reply<v1::CommitCheckpointResponse> c0;
  v1::Manifest m;
  *m.add_files() = Write(round.partial_dir(), "shard-0", "x");
  Commit(0, round, m, &c0);
  v1::AbortCheckpointRequest abort;
  abort.set_run_id(run_);
  abort.set_generation(0);
  abort.set_rank(2);
  abort.set_round_id(round.round_id());
  abort.set_reason("RuntimeError: out of memory");
  Reply<v1::AbortCheckpointResponse> aborted;
  coord_->checkpoints().Abort(abort, aborted.pending());
  ASSERT_TRUE(aborted.WaitFor());
  ASSERT_TRUE(aborted.value.ok()) << aborted.value.status();
  ASSERT_TRUE(c0.WaitFor());
  EXPECT_EQ(c0.value.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(c0.value.status().message().find("rank 2 aborted the checkpoint at step 10: RuntimeError"),
            std::string::npos)
      << c0.value.status();
  coord_->AwaitFileWork();
  EXPECT_FALSE(AnyPartial());
}

TEST_F(ShardedRoundTest, AFileNoRankListedFailsThePublication) {
  v1::BeginCheckpointResponse round = Begin(10);
  Write(round.partial_dir(), "stray.pt", "nobody's");
  v1::Manifest m0;
  *m0.add_files() = Write(round.partial_dir(), "shard-0", "x");
  Reply<v1::CommitCheckpointResponse> c[kWorld];
  for (int r = 0; r < kWorld; ++r) Commit(r, round, r == 0 ? m0 : v1::Manifest(), &c[r]);
  // Every reply is awaited: one delivered after the test returned would write to a dead Reply.
  for (auto& reply : c) ASSERT_TRUE(reply.WaitFor());
  EXPECT_EQ(c[0].value.status().code(), absl::StatusCode::kDataLoss) << c[0].value.status();
  EXPECT_NE(c[0].value.status().message().find("\"stray.pt\", which no rank's manifest lists"), std::string::npos)
      << c[0].value.status();
  EXPECT_EQ(Latest(), "");

  // A round where no rank listed anything is not a checkpoint.
  round = Begin(20);
  Reply<v1::CommitCheckpointResponse> e[kWorld];
  for (int r = 0; r < kWorld; ++r) Commit(r, round, v1::Manifest(), &e[r]);
  for (auto& reply : e) ASSERT_TRUE(reply.WaitFor());
  EXPECT_NE(e[0].value.status().message().find("no rank of the sharded round listed a file"), std::string::npos)
      << e[0].value.status();
}

TEST_F(ShardedRoundTest, ARetriedCommitReplacesTheFirstAndABadLayoutAbortsTheRound) {
  v1::BeginCheckpointResponse round = Begin(10);
  v1::Manifest m0;
  *m0.add_files() = Write(round.partial_dir(), "shard-0", "x");
  Reply<v1::CommitCheckpointResponse> first, retry, c[kWorld];
  Commit(0, round, m0, &first);
  Commit(0, round, m0, &retry);  // the first call's reply was lost: the same rank commits again
  ASSERT_TRUE(first.WaitFor());
  EXPECT_EQ(first.value.status().code(), absl::StatusCode::kCancelled) << first.value.status();
  for (int r = 1; r < kWorld; ++r) Commit(r, round, v1::Manifest(), &c[r]);
  for (int r = 1; r < kWorld; ++r) ASSERT_TRUE(c[r].WaitFor());
  ASSERT_TRUE(retry.WaitFor());
  ASSERT_TRUE(retry.value.ok()) << retry.value.status();
  EXPECT_EQ(retry.value->checkpoint().shards_size(), 1);

  // A layout nested too deep: the rank is refused, the others' round ends, nothing is left.
  round = Begin(20);
  Reply<v1::CommitCheckpointResponse> d0, d1;
  Commit(0, round, v1::Manifest(), &d0);
  Commit(1, round, v1::Manifest(), &d1, std::string(100, '[') + std::string(100, ']'));
  ASSERT_TRUE(d0.WaitFor() && d1.WaitFor());
  EXPECT_EQ(d1.value.status().code(), absl::StatusCode::kInvalidArgument) << d1.value.status();
  EXPECT_NE(d1.value.status().message().find("rank 1's checkpoint layout nests deeper than 64 levels"),
            std::string::npos)
      << d1.value.status();
  EXPECT_FALSE(fs::exists(round.partial_dir()));  // gone before the refused rank heard
  EXPECT_EQ(d0.value.status().code(), absl::StatusCode::kAborted) << d0.value.status();
  EXPECT_EQ(Latest(), "step-10");
}

// A non-writer's layout ends the round for every rank (left open, they would wait out the lease);
// the next round publishes the writer's.
TEST_F(ShardedRoundTest, ASingleWritersLayoutIsPublishedAndANonWritersIsRefused) {
  auto begin_single = [&](int64_t step) {
    std::vector<std::unique_ptr<Reply<v1::BeginCheckpointResponse>>> begun;
    for (int r = 0; r < kWorld; ++r) {
      begun.push_back(std::make_unique<Reply<v1::BeginCheckpointResponse>>());
      coord_->checkpoints().Begin(BeginRequest(r, step, false), begun.back()->pending());
    }
    for (auto& b : begun) EXPECT_TRUE(b->WaitFor() && b->value.ok());
    return begun[0]->value.value_or(v1::BeginCheckpointResponse());
  };
  v1::BeginCheckpointResponse round = begin_single(9);
  Reply<v1::CommitCheckpointResponse> writer_first;
  v1::Manifest written;
  *written.add_files() = Write(round.partial_dir(), "model.pt", "w");
  Commit(0, round, written, &writer_first);  // waits for the other ranks
  Reply<v1::CommitCheckpointResponse> refused;
  Commit(1, round, v1::Manifest(), &refused, R"({"mesh": [4]})");
  ASSERT_TRUE(refused.WaitFor() && writer_first.WaitFor());
  EXPECT_EQ(refused.value.status().code(), absl::StatusCode::kInvalidArgument) << refused.value.status();
  EXPECT_NE(refused.value.status().message().find("rank 1 sent a layout but the writer of this round is rank 0"),
            std::string::npos)
      << refused.value.status();
  EXPECT_EQ(writer_first.value.status().code(), absl::StatusCode::kAborted) << writer_first.value.status();
  EXPECT_NE(writer_first.value.status().message().find("rank 1 sent a layout"), std::string::npos)
      << writer_first.value.status();
  EXPECT_FALSE(fs::exists(round.partial_dir()));  // gone before either rank heard

  round = begin_single(10);
  ASSERT_EQ(round.writer_rank(), 0);
  EXPECT_FALSE(round.sharded());
  Reply<v1::BeginCheckpointResponse> other_kind;  // a retry of rank 2's Begin, asking otherwise
  coord_->checkpoints().Begin(BeginRequest(2, 10, true), other_kind.pending());
  ASSERT_TRUE(other_kind.WaitFor());
  EXPECT_NE(other_kind.value.status().message().find(
                "rank 2 asked for a sharded round at step 10 but the open round is a single-writer round"),
            std::string::npos)
      << other_kind.value.status();
  Reply<v1::CommitCheckpointResponse> c[kWorld];
  v1::Manifest m;
  *m.add_files() = Write(round.partial_dir(), ".metadata", "plan");
  Commit(0, round, m, &c[0], R"({"mesh":   [4]})");
  for (int r = 1; r < kWorld; ++r) Commit(r, round, v1::Manifest(), &c[r]);
  for (auto& reply : c) {
    ASSERT_TRUE(reply.WaitFor());
    ASSERT_TRUE(reply.value.ok()) << reply.value.status();
  }
  std::ifstream in(ckpt_dir() + "/step-10/manifest.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["layout"], nlohmann::json::parse(R"({"mesh": [4]})"));
  EXPECT_EQ(doc["sharded"], false);
  EXPECT_EQ(doc["files"][0]["rank"], 0);
}

TEST_F(ShardedRoundTest, RanksMustAskAlikeAndLayoutsMustBeJsonAndAgree) {
  Reply<v1::BeginCheckpointResponse> b0, b1;
  coord_->checkpoints().Begin(BeginRequest(0, 10, true), b0.pending());
  coord_->checkpoints().Begin(BeginRequest(1, 10, false), b1.pending());
  ASSERT_TRUE(b1.WaitFor());
  EXPECT_EQ(b1.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b1.value.status().message().find(
                "rank 1 asked for a single-writer round at step 10 but other ranks asked for a sharded round"),
            std::string::npos)
      << b1.value.status();

  ShardCollector shards;
  v1::Manifest m;
  v1::ManifestFile* f = m.add_files();
  f->set_name("a");
  f->set_size(1);
  f->set_sha256(std::string(64, 'a'));
  EXPECT_TRUE(shards.Accept(0, m, R"({"mesh": [2, 2]})").ok());
  absl::Status not_json = shards.Accept(1, v1::Manifest(), "{mesh");
  EXPECT_EQ(not_json.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_json.message().find("rank 1's checkpoint layout is not a JSON document"), std::string::npos);
  absl::Status unlike = shards.Accept(1, v1::Manifest(), R"({"mesh": [4]})");
  EXPECT_NE(unlike.message().find("differs from rank 0's"), std::string::npos) << unlike;
  EXPECT_TRUE(shards.Accept(2, v1::Manifest(), "{\"mesh\":[ 2,2 ]}").ok());  // the same document, spaced otherwise
  EXPECT_EQ(shards.ranks(), 2u);                                             // a refused call keeps nothing
  // A retry of the same rank replaces its claims: it may drop a file another rank then claims.
  EXPECT_TRUE(shards.Accept(0, v1::Manifest(), "").ok());
  EXPECT_TRUE(shards.Accept(1, m, "").ok());
  std::vector<int> ranks;
  EXPECT_EQ(shards.Combined(ranks).files_size(), 1);
  EXPECT_EQ(ranks, std::vector<int>{1});
  // A retry is compared with every other rank's layout: once rank 1 described the same document,
  // rank 2 cannot change it alone.
  EXPECT_TRUE(shards.Accept(1, m, R"({"mesh": [2, 2]})").ok());
  absl::Status changed = shards.Accept(2, v1::Manifest(), R"({"mesh": [4]})");
  EXPECT_NE(changed.message().find("rank 2's checkpoint layout differs from rank 1's"), std::string::npos) << changed;
  EXPECT_EQ(shards.layout_json(), R"({"mesh":[2,2]})");
}

}  // namespace
}  // namespace dt
