// Verification against the manifest, atomic publication, `latest`, retention, partial cleanup.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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
  std::string LatestTarget() {
    char buf[256];
    ssize_t n = ::readlink(JoinPath(ckpt_, "latest").c_str(), buf, sizeof(buf));
    return n > 0 ? std::string(buf, n) : "";
  }
};

TEST_F(PublisherTest, PublishesAtomicallyAndPointsLatest) {
  std::string partial = JoinPath(ckpt_, PartialDirName(10, "abcd"));
  v1::Manifest m = WritePartial(partial, {{"model.pt", "weights"}, {"state.json", "{}"}});
  auto info = VerifyAndPublish(ckpt_, partial, JoinPath(ckpt_, "step-10"), 10, m);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes(), 9);
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, "step-10/manifest.json")));
  EXPECT_EQ(LatestTarget(), "step-10");
  auto found = FindLatest(ckpt_);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step(), 10);
  EXPECT_EQ(found->bytes(), 9);
}

TEST_F(PublisherTest, ChecksumMismatchIsDataLossAndLatestStays) {
  std::string p1 = JoinPath(ckpt_, PartialDirName(5, "aaaa"));
  ASSERT_TRUE(VerifyAndPublish(ckpt_, p1, JoinPath(ckpt_, "step-5"), 5,
                               WritePartial(p1, {{"model.pt", "good"}})).ok());
  std::string p2 = JoinPath(ckpt_, PartialDirName(10, "bbbb"));
  v1::Manifest m = WritePartial(p2, {{"model.pt", "good"}});
  std::ofstream(JoinPath(p2, "model.pt"), std::ios::binary) << "evil";  // same size, other bytes
  auto bad = VerifyAndPublish(ckpt_, p2, JoinPath(ckpt_, "step-10"), 10, m);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("SHA-256"), std::string::npos);
  EXPECT_EQ(LatestTarget(), "step-5");
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-10")));
}

TEST_F(PublisherTest, SizeMismatchMissingAndExtraFilesAreNamed) {
  std::string p = JoinPath(ckpt_, PartialDirName(3, "cccc"));
  v1::Manifest m = WritePartial(p, {{"a", "12345"}});
  m.mutable_files(0)->set_size(4);
  auto r = VerifyAndPublish(ckpt_, p, JoinPath(ckpt_, "step-3"), 3, m);
  EXPECT_NE(r.status().message().find("5 bytes on disk but 4"), std::string::npos) << r.status();
  m = WritePartial(p, {{"a", "12345"}});
  std::ofstream(JoinPath(p, "stray"), std::ios::binary) << "x";
  r = VerifyAndPublish(ckpt_, p, JoinPath(ckpt_, "step-3"), 3, m);
  EXPECT_NE(r.status().message().find("\"stray\""), std::string::npos) << r.status();
  fs::remove(JoinPath(p, "stray"));
  v1::ManifestFile* ghost = m.add_files();
  ghost->set_name("ghost");
  ghost->set_size(1);
  ghost->set_sha256(std::string(64, 'a'));
  r = VerifyAndPublish(ckpt_, p, JoinPath(ckpt_, "step-3"), 3, m);
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
  for (int step : {1, 2, 3, 4}) fs::create_directories(JoinPath(ckpt_, "step-" + std::to_string(step)));
  fs::create_directories(JoinPath(ckpt_, PartialDirName(5, "dead")));
  ASSERT_TRUE(ApplyRetention(ckpt_, {3, 4}).ok());
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-1")));
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, "step-2")));
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, "step-3")));
  EXPECT_TRUE(fs::exists(JoinPath(ckpt_, PartialDirName(5, "dead"))));  // not a step-N dir
  EXPECT_EQ(*RemovePartials(ckpt_), 1);
  EXPECT_FALSE(fs::exists(JoinPath(ckpt_, PartialDirName(5, "dead"))));
}

TEST_F(PublisherTest, LatestWithAMismatchedManifestIsNotResumedFrom) {
  std::string p = JoinPath(ckpt_, PartialDirName(7, "dddd"));
  ASSERT_TRUE(VerifyAndPublish(ckpt_, p, JoinPath(ckpt_, "step-7"), 7, WritePartial(p, {{"m", "abc"}})).ok());
  std::ofstream(JoinPath(ckpt_, "step-7/m"), std::ios::binary | std::ios::app) << "truncated?";
  EXPECT_FALSE(FindLatest(ckpt_).has_value());
}

}  // namespace
}  // namespace dt
