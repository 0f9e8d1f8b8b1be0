// The state database's WAL checkpointed on a thread of its own, on a real SQLite file: the log
// stays bounded while a writer commits without pause, and every commit is in the database after
// it is closed and opened again.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "common/fs.h"
#include "coordinator/wal_checkpointer.h"
#include "tests/test_util.h"

namespace dt {
namespace {

void Exec(sqlite3* db, const std::string& sql) {
  char* error = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK) << (error ? error : "") << ": " << sql;
}

int64_t FileSize(const std::string& path) {
  struct stat st = {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

// A writer as StateDb's: WAL, synchronous=NORMAL, and a 5 s busy timeout (what a checkpoint
// waiting for readers would make a commit wait); pages of `page_size` bytes.
void OpenWriter(const std::string& path, sqlite3** writer, int page_size = 4096) {
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), writer, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                            nullptr),
            SQLITE_OK);
  sqlite3_busy_timeout(*writer, 5000);
  Exec(*writer, "PRAGMA page_size=" + std::to_string(page_size) +
                    "; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                    "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB);");
}

// With SQLite's default pages (4 KiB) and with the state database's (16 KiB): the bound is in
// bytes, so larger pages do not let the log grow larger.
class WalCheckpointerPages : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(PageSizes, WalCheckpointerPages, ::testing::Values(4096, 16384));

TEST_P(WalCheckpointerPages, TheLogStaysBoundedWhileAWriterCommitsAndEveryCommitIsKept) {
  testing::TempDir tmp;
  const std::string path = JoinPath(tmp.path(), "state.db");
  sqlite3* writer = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenWriter(path, &writer, GetParam()));
  absl::StatusOr<std::unique_ptr<WalCheckpointer>> checkpointer = WalCheckpointer::Start(path, writer);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();

  // 4,000 commits of 40 KB (160 MB; 40,000 pages of 4 KiB) with no pause between them, as under ingest.
  // Without checkpoints the log would hold all of it; SQLite's own checkpoint is off (the hook).
  constexpr int kCommits = 4000;
  int64_t largest_log = 0;
  sqlite3_stmt* insert = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(writer, "INSERT INTO t (b) VALUES (zeroblob(40000))", -1, &insert, nullptr), SQLITE_OK);
  for (int i = 0; i < kCommits; ++i) {
    ASSERT_EQ(sqlite3_step(insert), SQLITE_DONE) << sqlite3_errmsg(writer);
    sqlite3_reset(insert);
    largest_log = std::max(largest_log, FileSize(path + "-wal"));
  }
  sqlite3_finalize(insert);
  EXPECT_GT((*checkpointer)->checkpoints(), 0);
  // The log restarts once a checkpoint has caught up; at worst at 16 times 4 MB (66 MB with the
  // frames' headers), where the writer checkpoints itself. Unbounded, it would reach 160 MB.
  EXPECT_LT(largest_log, 80 << 20) << "the write-ahead log grew to " << largest_log << " bytes";

  checkpointer->reset();
  ASSERT_EQ(sqlite3_close(writer), SQLITE_OK);
  sqlite3* reopened = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &reopened, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* count = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(reopened, "SELECT count(*) FROM t", -1, &count, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(count), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(count, 0), kCommits);
  sqlite3_finalize(count);
  sqlite3_close(reopened);
}

TEST(WalCheckpointer, AWriterPastTheBoundNeverWaitsForAReader) {
  testing::TempDir tmp;
  const std::string path = JoinPath(tmp.path(), "state.db");
  sqlite3* writer = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenWriter(path, &writer));
  Exec(writer, "INSERT INTO t (b) VALUES (zeroblob(10))");
  absl::StatusOr<std::unique_ptr<WalCheckpointer>> checkpointer = WalCheckpointer::Start(path, writer);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  // A read that lasts (a long metric query on StateDb's read connection) holds its snapshot.
  sqlite3* reader = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &reader, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  Exec(reader, "BEGIN; SELECT count(*) FROM t;");

  // 2,000 commits of 40 KB: 20,000 pages, past the writer's own checkpoint at 16,000.
  sqlite3_stmt* insert = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(writer, "INSERT INTO t (b) VALUES (zeroblob(40000))", -1, &insert, nullptr), SQLITE_OK);
  absl::Duration slowest;
  for (int i = 0; i < 2000; ++i) {
    absl::Time start = absl::Now();
    ASSERT_EQ(sqlite3_step(insert), SQLITE_DONE) << sqlite3_errmsg(writer);
    sqlite3_reset(insert);
    slowest = std::max(slowest, absl::Now() - start);
  }
  sqlite3_finalize(insert);
  // Waiting for the reader would take the whole busy timeout (5 s) at each commit past the bound.
  EXPECT_LT(slowest, absl::Seconds(2)) << "a commit waited " << slowest;
  Exec(reader, "COMMIT;");
  sqlite3_close(reader);
  checkpointer->reset();
  ASSERT_EQ(sqlite3_close(writer), SQLITE_OK);
}

TEST(WalCheckpointer, AFileThatCannotBeOpenedIsAFailedPrecondition) {
  testing::TempDir tmp;
  absl::StatusOr<std::unique_ptr<WalCheckpointer>> checkpointer =
      WalCheckpointer::Start(JoinPath(tmp.path(), "missing/state.db"), nullptr);
  ASSERT_FALSE(checkpointer.ok());
  EXPECT_EQ(checkpointer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(checkpointer.status().message().find("missing/state.db"), std::string::npos) << checkpointer.status();
}

}  // namespace
}  // namespace dt
