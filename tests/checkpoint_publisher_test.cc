// Verification against the manifest, atomic publication, `latest`, retention, partial cleanup.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "coordinator/checkpoint_publisher.h"
#include "tests/test_util.h"

namespace dt {
namespace {

namespace fs = std::filesystem;

class PublisherTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string ckpt_ = tmp_.Sub("checkpoints");

  // Writes files into a partial directory and returns their manifest.
  v1::Manifest WritePartial(const std::string& dir, const std::map<std::string, std::string>& files) {
    fs::create_directories(dir);
    v1::Manifest m;
    for (const auto& [name, data] : files) {
      std::ofstream(JoinPath(dir, name), std::ios::binary) << data;
      auto* f = m.add_files();
      f->set_name(name);
      f->set_size(static_cast<int64_t>(data.size()));
      f->set_sha256(Sha256Hex(data));
    }
    return m;
  }
  DirFd Dir() {
    fs::create_directories(ckpt_);
    absl::StatusOr<DirFd> d = DirFd::Open(ckpt_);
    EXPECT_TRUE(d.ok()) << d.status();
    return std::move(*d);
  }
  absl::StatusOr<v1::CheckpointInfo> Publish(const std::string& partial_name, int64_t step, const v1::Manifest& m,
                                             CheckpointVerification v = CheckpointVerification::kDigests) {
    RoundWriters writers;
    writers.world_size = 1;
    return VerifyAndPublish(Dir(), partial_name, step, m, writers, v);
  }
  std::string LatestTarget() {
    char buf[256];
    ssize_t n = ::readlink(JoinPath(ckpt_, "latest").c_str(), buf, sizeof(buf));
    return n > 0 ? std::string(buf, n) : "";
  }
};

TEST_F(PublisherTest, PublishesAtomicallyAndPointsLatest) {
  std::string partial = JoinPath(ckpt_, PartialDirName(10, "abcd"));
  v1::Manifest m = WritePartial(partial, {{"model.pt", "weights"}, {"state.json", "{}"}});
  auto info = Publish(PartialDirName(10, "abcd"), 10, m);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes(), 9);
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, "step-10/manifest.json")));
  EXPECT_EQ(LatestTarget(), "step-10");
  auto found = FindLatest(Dir());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step(), 10);
  EXPECT_EQ(found->bytes(), 9);
}

// The largest layout a round takes (1 MiB, nested 64 deep) grows past what readers of
// manifest.json take when indented: it is written compact, and a reused directory still finds it.
TEST_F(PublisherTest, TheLargestLayoutStillGivesAManifestReadersTake) {
  std::string layout = std::string(63, '[') + "[0";
  while (layout.size() < (1 << 20) - 200) layout += ",0";
  layout += std::string(64, ']');
  std::string partial = JoinPath(ckpt_, PartialDirName(10, "abcd"));
  v1::Manifest m = WritePartial(partial, {{"model.pt", "weights"}});
  RoundWriters writers;
  writers.world_size = 1;
  writers.layout_json = layout;
  auto info = VerifyAndPublish(Dir(), PartialDirName(10, "abcd"), 10, m, writers, CheckpointVerification::kDigests);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_LT(fs::file_size(JoinPath(ckpt_, "step-10/manifest.json")), 2u << 20);
  auto found = FindLatest(Dir());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step(), 10);
}

TEST_F(PublisherTest, ChecksumMismatchIsDataLossAndLatestStays) {
  std::string p1 = JoinPath(ckpt_, PartialDirName(5, "aaaa"));
  ASSERT_TRUE(Publish(PartialDirName(5, "aaaa"), 5, WritePartial(p1, {{"model.pt", "good"}})).ok());
  std::string p2 = JoinPath(ckpt_, PartialDirName(10, "bbbb"));
  v1::Manifest m = WritePartial(p2, {{"model.pt", "good"}});
  std::ofstream(JoinPath(p2, "model.pt"), std::ios::binary) << "evil";  // same size, other bytes
  auto bad = Publish(PartialDirName(10, "bbbb"), 10, m);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("SHA-256"), std::string::npos);
  EXPECT_EQ(LatestTarget(), "step-5");
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-10")));
}

// By default the coordinator does not re-read what the writer hashed: sizes, types and the listing
// are checked, and the writer's digests go into manifest.json for whoever loads the checkpoint.
TEST_F(PublisherTest, SizesOnlyVerificationRecordsTheWritersDigestsWithoutReadingTheFiles) {
  std::string p = JoinPath(ckpt_, PartialDirName(10, "dddd"));
  v1::Manifest m = WritePartial(p, {{"model.pt", "good"}});
  std::ofstream(JoinPath(p, "model.pt"), std::ios::binary) << "evil";  // same size, other bytes
  auto info = Publish(PartialDirName(10, "dddd"), 10, m, CheckpointVerification::kSizes);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(LatestTarget(), "step-10");
  std::string manifest = testing::Slurp(JoinPath(ckpt_, "step-10/manifest.json"));
  EXPECT_NE(manifest.find(Sha256Hex("good")), std::string::npos) << manifest;  // what the writer hashed
  // Sizes, types and the listing are still checked.
  std::string q = JoinPath(ckpt_, PartialDirName(11, "eeee"));
  v1::Manifest short_file = WritePartial(q, {{"model.pt", "12345"}});
  short_file.mutable_files(0)->set_size(4);
  auto r = Publish(PartialDirName(11, "eeee"), 11, short_file, CheckpointVerification::kSizes);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("5 bytes on disk but 4"), std::string::npos) << r.status();
  EXPECT_EQ(LatestTarget(), "step-10");
}

TEST_F(PublisherTest, SizeMismatchMissingAndExtraFilesAreNamed) {
  std::string p = JoinPath(ckpt_, PartialDirName(3, "cccc"));
  v1::Manifest m = WritePartial(p, {{"a", "12345"}});
  m.mutable_files(0)->set_size(4);
  auto r = Publish(PartialDirName(3, "cccc"), 3, m);
  EXPECT_NE(r.status().message().find("5 bytes on disk but 4"), std::string::npos) << r.status();
  m = WritePartial(p, {{"a", "12345"}});
  std::ofstream(JoinPath(p, "stray"), std::ios::binary) << "x";
  r = Publish(PartialDirName(3, "cccc"), 3, m);
  EXPECT_NE(r.status().message().find("\"stray\""), std::string::npos) << r.status();
  fs::remove(JoinPath(p, "stray"));
  v1::ManifestFile* ghost = m.add_files();
  ghost->set_name("ghost");
  ghost->set_size(1);
  ghost->set_sha256(std::string(64, 'a'));
  r = Publish(PartialDirName(3, "cccc"), 3, m);
  EXPECT_NE(r.status().message().find("missing"), std::string::npos) << r.status();
}

TEST_F(PublisherTest, MalformedManifestsAreRefused) {
  v1::Manifest m;
  EXPECT_EQ(ValidateManifest(m).code(), absl::StatusCode::kInvalidArgument);
  auto* f = m.add_files();
  f->set_name("../escape");
  f->set_size(1);
  f->set_sha256(std::string(64, '0'));
  EXPECT_EQ(ValidateManifest(m).code(), absl::StatusCode::kInvalidArgument);
  f->set_name("ok");
  f->set_sha256("xyz");
  EXPECT_EQ(ValidateManifest(m).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PublisherTest, RetentionAndPartialCleanup) {
  for (int step : {1, 2, 3, 4, 9}) fs::create_directories(JoinPath(ckpt_, "step-" + std::to_string(step)));
  fs::create_directories(JoinPath(ckpt_, PartialDirName(5, "dead")));
  ASSERT_TRUE(ApplyRetention(Dir(), {3, 4}).ok());
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-1")));
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-2")));
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, "step-3")));
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, "step-9"))) << "newer than the pass's commit: a later run's";
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, PartialDirName(5, "dead"))));  // not a step-N dir
  EXPECT_EQ(*RemovePartials(Dir()), 1);
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, PartialDirName(5, "dead"))));
}

// A rank still writing into an aborted round by path cannot leave it behind: the directory is
// moved aside before it is emptied, so the rank's next file fails to open instead of landing in
// a directory the removal has already listed.
TEST_F(PublisherTest, AnAbortedRoundIsRemovedWhileARankStillWritesIntoIt) {
  const std::string partial = PartialDirName(7, "abcd");
  WritePartial(JoinPath(ckpt_, partial), {{"model.pt", "x"}, {"optimizer.pt", "y"}});
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread rank([&] {
    for (int i = 0; !stop; ++i) {
      if (std::ofstream(JoinPath(ckpt_, partial) + "/shard-" + std::to_string(i))) ++opened;
    }
  });
  while (opened < 50) std::this_thread::yield();
  absl::Status removed = RemoveAbortedPartial(Dir(), partial);
  stop = true;
  rank.join();
  EXPECT_TRUE(removed.ok()) << removed;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ckpt_)) left.push_back(e.path().filename().string());
  EXPECT_TRUE(left.empty()) << absl::StrJoin(left, ", ");
  EXPECT_TRUE(RemoveAbortedPartial(Dir(), partial).ok());  // gone already
}

TEST_F(PublisherTest, LatestWithAMismatchedManifestIsNotResumedFrom) {
  std::string p = JoinPath(ckpt_, PartialDirName(7, "dddd"));
  ASSERT_TRUE(Publish(PartialDirName(7, "dddd"), 7, WritePartial(p, {{"m", "abc"}})).ok());
  std::ofstream(JoinPath(ckpt_, "step-7/m"), std::ios::binary | std::ios::app) << "truncated?";
  EXPECT_FALSE(FindLatest(Dir()).has_value());
}

// ---- Links planted inside the tree (a run-token holder can write there) -----------------------

// A file outside every run: what a planted link would reach.
class PlantedLinkTest : public PublisherTest {
 protected:
  std::string outside_ = tmp_.Sub("elsewhere");
  std::string secret_ = JoinPath(outside_, "secret");
  void SetUp() override {
    fs::create_directories(outside_);
    std::ofstream(secret_, std::ios::binary) << "the admin's secret";
  }
};

TEST_F(PlantedLinkTest, ALinkAsACheckpointFileIsRefusedAndNothingAboutItsTargetIsSaid) {
  std::string p = JoinPath(ckpt_, PartialDirName(4, "eeee"));
  // The manifest matches the outside file exactly, so only the link check can refuse it.
  v1::Manifest m = WritePartial(p, {{"model.pt", "the admin's secret"}});
  fs::remove(JoinPath(p, "model.pt"));
  fs::create_symlink(secret_, JoinPath(p, "model.pt"));
  auto r = Publish(PartialDirName(4, "eeee"), 4, m);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  std::string msg(r.status().message());
  EXPECT_NE(msg.find("symbolic link"), std::string::npos) << msg;
  EXPECT_EQ(msg.find(secret_), std::string::npos) << msg;
  EXPECT_EQ(msg.find(Sha256Hex("the admin's secret")), std::string::npos) << msg;
  EXPECT_EQ(msg.find("bytes"), std::string::npos) << msg;  // nor the outside file's size
  EXPECT_EQ(LatestTarget(), "");
}

TEST_F(PlantedLinkTest, APartialDirectoryReplacedByALinkGetsNoManifestWrittenThrough) {
  std::string p = JoinPath(ckpt_, PartialDirName(6, "ffff"));
  v1::Manifest m = WritePartial(outside_, {{"model.pt", "w"}});
  fs::create_directories(ckpt_);
  fs::create_symlink(outside_, p);
  auto r = Publish(PartialDirName(6, "ffff"), 6, m);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_FALSE(fs::exists(JoinPath(outside_, "manifest.json")));
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-6")));
  // Removing the partials removes the link, not what it points at.
  EXPECT_EQ(*RemovePartials(Dir()), 1);
  EXPECT_TRUE(fs::exists(JoinPath(outside_, "model.pt")));
  EXPECT_FALSE(fs::is_symlink(p));
}

TEST_F(PlantedLinkTest, RetentionAndCleanUpNeverDeleteThroughALink) {
  fs::create_directories(JoinPath(outside_, "step-1"));
  std::ofstream(JoinPath(outside_, "step-1/model.pt")) << "another experiment's";
  fs::create_directories(ckpt_);
  fs::create_symlink(JoinPath(outside_, "step-1"), JoinPath(ckpt_, "step-1"));
  fs::create_directories(JoinPath(ckpt_, "step-2"));
  fs::create_directories(JoinPath(ckpt_, PartialDirName(3, "gggg")));
  fs::create_symlink(outside_, JoinPath(JoinPath(ckpt_, PartialDirName(3, "gggg")), "escape"));
  ASSERT_TRUE(ApplyRetention(Dir(), {5}).ok());
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-2")));
  ASSERT_TRUE(RemovePartials(Dir()).ok());
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, PartialDirName(3, "gggg"))));
  EXPECT_TRUE(fs::exists(JoinPath(outside_, "step-1/model.pt")));
  EXPECT_TRUE(fs::exists(secret_));
}

TEST_F(PlantedLinkTest, LatestNamingALinkedDirectoryIsNotResumedFrom) {
  v1::Manifest m = WritePartial(JoinPath(outside_, "step-9"), {{"m", "abc"}});
  std::ofstream(JoinPath(outside_, "step-9/manifest.json")) << R"({"step": 9, "files": [{"name": "m", "size": 3}]})";
  fs::create_directories(ckpt_);
  fs::create_symlink(JoinPath(outside_, "step-9"), JoinPath(ckpt_, "step-9"));
  fs::create_symlink("step-9", JoinPath(ckpt_, "latest"));
  EXPECT_FALSE(FindLatest(Dir()).has_value());
}

TEST_F(PlantedLinkTest, AFifoAsACheckpointFileIsRefusedWithoutBlocking) {
  std::string p = JoinPath(ckpt_, PartialDirName(2, "hhhh"));
  v1::Manifest m = WritePartial(p, {{"model.pt", "x"}});
  fs::remove(JoinPath(p, "model.pt"));
  ASSERT_EQ(::mkfifo(JoinPath(p, "model.pt").c_str(), 0600), 0);
  auto r = Publish(PartialDirName(2, "hhhh"), 2, m);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status();
}

TEST_F(PlantedLinkTest, AnEndlesslyNestedPartialDirectoryIsRefusedNotRecursedInto) {
  std::string p = JoinPath(ckpt_, PartialDirName(8, "iiii"));
  std::string deep = p;
  for (int i = 0; i < 100; ++i) deep = JoinPath(deep, "d");
  fs::create_directories(deep);
  auto removed = RemovePartials(Dir());
  EXPECT_EQ(removed.status().code(), absl::StatusCode::kFailedPrecondition) << removed.status();
  EXPECT_NE(removed.status().message().find("nested more than 64"), std::string::npos) << removed.status();
  // A checkpoint-shaped tree (a few levels) still goes.
  fs::remove_all(p);
  fs::create_directories(JoinPath(p, "a/b/c"));
  EXPECT_EQ(*RemovePartials(Dir()), 1);
  EXPECT_FALSE(fs::exists(p));
}

}  // namespace
}  // namespace dt
