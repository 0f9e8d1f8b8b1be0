// The coordinator's state dir: one dtcoord at a time, private, and never silently emptied.
#include "coordinator/state_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/fs.h"
#include "tests/test_util.h"

namespace dt {
namespace {

mode_t Mode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(StateDir, ANewDirectoryIsPrivateAndHeldByOneCoordinator) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "state");
  auto first = StateDir::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Mode(path), 0700u);
  ASSERT_TRUE(first->Publish("127.0.0.1:50051").ok());
  auto second = StateDir::Open(path);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another dtcoord (pid " + std::to_string(::getpid()) +
                                           " serving on 127.0.0.1:50051)"),
            std::string::npos)
      << second.status();
  *first = std::move(*StateDir::Open(JoinPath(tmp.path(), "other")));  // releases the first lock
  EXPECT_TRUE(StateDir::Open(path).ok());
}

// Deleting dtcoord.lock by hand does not let a second coordinator onto the same state: the directory
// itself is held too.
TEST(StateDir, ARemovedLockFileDoesNotLetASecondCoordinatorIn) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "state");
  auto first = StateDir::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(::unlink(JoinPath(path, "dtcoord.lock").c_str()), 0);
  auto second = StateDir::Open(path);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("still holds the directory"), std::string::npos) << second.status();
}

TEST(StateDir, ADirectoryOthersCanWriteIsRefusedAndLeftAsItWas) {
  testing::TempDir tmp;
  std::string shared = tmp.Sub("shared");
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  auto held = StateDir::Open(shared);
  ASSERT_EQ(held.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(held.status().message().find("writable by others (mode 1777)"), std::string::npos) << held.status();
  EXPECT_EQ(Mode(shared), 01777u);
  std::string mine = tmp.Sub("mine");
  ASSERT_EQ(::chmod(mine.c_str(), 0750), 0);
  EXPECT_TRUE(StateDir::Open(mine).ok());  // an existing private directory is used as it is
  EXPECT_EQ(Mode(mine), 0750u);
}

TEST(StateDir, AnEmptyDatabaseAfterAFirstStartIsRefused) {
  testing::TempDir tmp;
  std::string path = tmp.Sub("state");
  ASSERT_EQ(::chmod(path.c_str(), 0700), 0);
  Write(JoinPath(path, "admin.token"), "secret\n");
  auto missing = StateDir::Open(path);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("dtcoord.db is missing"), std::string::npos) << missing.status();
  Write(JoinPath(path, "dtcoord.db"), "");
  auto empty = StateDir::Open(path);
  ASSERT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(empty.status().message().find("is empty"), std::string::npos) << empty.status();
  EXPECT_NE(empty.status().message().find("restore"), std::string::npos);
  // Killed before SQLite's first checkpoint: the data is in the write-ahead log.
  Write(JoinPath(path, "dtcoord.db-wal"), "pages");
  EXPECT_TRUE(StateDir::Open(path).ok());
}

}  // namespace
}  // namespace dt
