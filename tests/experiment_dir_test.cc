// The experiment directory: one spelling per directory, never reached through a link, and
// refused once it is no longer the directory the run was given.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/fs.h"
#include "coordinator/experiment_dir.h"
#include "tests/test_util.h"

namespace dt {
namespace {

namespace fs = std::filesystem;

class ExperimentDirTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_ = tmp_.Sub("runs");
};

TEST_F(ExperimentDirTest, DotAndDotDotComponentsAreRefused) {
  for (const std::string& spelling : {save_ + "/.", save_ + "/./", tmp_.path() + "/x/../runs"}) {
    auto d = ResolveExperimentDir(spelling, "exp");
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << spelling;
  }
}

TEST_F(ExperimentDirTest, ALinkedSaveDirResolvesToTheSameCanonicalDirectory) {
  fs::create_directories(save_);
  std::string link = tmp_.path() + "/runs-link";
  fs::create_directory_symlink(save_, link);
  auto direct = ResolveExperimentDir(save_, "exp");
  auto linked = ResolveExperimentDir(link + "/", "exp");
  ASSERT_TRUE(direct.ok()) << direct.status();
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(linked->path, direct->path);
  EXPECT_EQ(direct->path, fs::canonical(save_).string() + "/exp");
  EXPECT_TRUE(direct->created);
  EXPECT_FALSE(linked->created);
  EXPECT_EQ(linked->identity.inode(), direct->identity.inode());
  EXPECT_EQ(linked->identity.device(), direct->identity.device());
}

TEST_F(ExperimentDirTest, AnExperimentDirThatIsALinkIsRefused) {
  std::string elsewhere = tmp_.Sub("elsewhere");
  fs::create_directories(elsewhere);
  fs::create_directories(save_);
  fs::create_directory_symlink(elsewhere, save_ + "/exp");
  auto d = ResolveExperimentDir(save_, "exp");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  EXPECT_NE(d.status().message().find("symbolic link"), std::string::npos) << d.status();
}

TEST_F(ExperimentDirTest, LinkedLogsOrCheckpointsAreRefused) {
  auto d = ResolveExperimentDir(save_, "exp");
  ASSERT_TRUE(d.ok()) << d.status();
  std::string other = tmp_.Sub("other-exp/checkpoints");
  fs::create_directories(other);
  fs::create_directory_symlink(other, d->checkpoints_dir);
  absl::Status s = PrepareExperimentDir(*d);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(OpenCheckpointsDir(d->path, d->identity).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ExperimentDirTest, AMovedOrReplacedOrDeletedDirectoryIsNoLongerTheRunsDirectory) {
  auto d = ResolveExperimentDir(save_, "exp");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(PrepareExperimentDir(*d).ok());
  ASSERT_TRUE(OpenExperimentDir(d->path, d->identity).ok());
  fs::rename(d->path, save_ + "/exp-moved");
  fs::create_directories(d->path);  // a new directory under the old name
  auto replaced = OpenExperimentDir(d->path, d->identity);
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kFailedPrecondition) << replaced.status();
  EXPECT_NE(replaced.status().message().find("moved away or replaced"), std::string::npos);
  fs::remove(d->path);
  auto deleted = OpenExperimentDir(d->path, d->identity);
  EXPECT_EQ(deleted.status().code(), absl::StatusCode::kNotFound) << deleted.status();
  EXPECT_NE(deleted.status().message().find("was deleted"), std::string::npos);
}

}  // namespace
}  // namespace dt
