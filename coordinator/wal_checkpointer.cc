#include "coordinator/wal_checkpointer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dt {
namespace {

// SQLite's own autocheckpoint threshold, 1,000 pages of its default 4 KiB, kept in bytes: the
// state database's pages are larger (StateDb), and a threshold in pages would let the log grow
// with them.
constexpr int64_t kCheckpointBytes = 1000 * 4096;
// A log this many times the threshold means the writer never paused long enough for the thread
// to catch up: the writer then checkpoints itself, as SQLite would have at a sixteenth of it.
constexpr int kWriterCheckpointFactor = 16;

// The database's page size, as `db` reads it.
absl::StatusOr<int64_t> PageSize(sqlite3* db) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, "PRAGMA page_size;", -1, &st, nullptr) != SQLITE_OK || sqlite3_step(st) != SQLITE_ROW) {
    std::string msg = sqlite3_errmsg(db);
    sqlite3_finalize(st);
    return absl::FailedPreconditionError(msg);
  }
  int64_t size = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return size;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WalCheckpointer>> WalCheckpointer::Start(const std::string& path, sqlite3* writer) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot open state database ", path, " for checkpoints: ", msg));
  }
  // The writer waits for it to take a checkpoint lock, and it for the writer.
  sqlite3_busy_timeout(db, 5000);
  // A connection learns that the database is in WAL mode when it first reads it; until then a
  // checkpoint does nothing.
  char* error = nullptr;
  if (sqlite3_exec(db, "PRAGMA journal_mode=WAL;", nullptr, nullptr, &error) != SQLITE_OK) {
    std::string msg = error != nullptr ? error : sqlite3_errmsg(db);
    sqlite3_free(error);
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot read state database ", path, " for checkpoints: ", msg));
  }
  absl::StatusOr<int64_t> page_size = PageSize(db);
  if (!page_size.ok() || *page_size <= 0) {
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the page size of state database ", path, ": ", page_size.status().message()));
  }
  const int pages = static_cast<int>(std::max<int64_t>(1, kCheckpointBytes / *page_size));
  return std::unique_ptr<WalCheckpointer>(new WalCheckpointer(db, writer, pages));
}

WalCheckpointer::WalCheckpointer(sqlite3* db, sqlite3* writer, int checkpoint_pages)
    : db_(db), writer_(writer), checkpoint_pages_(checkpoint_pages) {
  sqlite3_wal_hook(writer_, &WalCheckpointer::OnCommit, this);  // replaces SQLite's autocheckpoint
  thread_ = std::thread([this] { Loop(); });
}

WalCheckpointer::~WalCheckpointer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  sqlite3_wal_hook(writer_, nullptr, nullptr);
  sqlite3_wal_autocheckpoint(writer_, checkpoint_pages_);
  sqlite3_close(db_);
}

int64_t WalCheckpointer::checkpoints() const {
  absl::MutexLock lock(&mu_);
  return checkpoints_;
}

bool WalCheckpointer::WantedOrStopping() const { return (wanted_ && !writer_turn_) || stopping_; }

// Runs inside the writer's commit, its write lock released: a flag for the thread, and, when the
// log has outgrown what the thread keeps up with, a checkpoint on the writer itself once the
// thread's pass is over (SQLite lets one checkpoint run at a time and would answer BUSY). It is
// PASSIVE, as SQLite's own: with no other writer it copies the whole log, so the next commit
// starts the log over, and it never waits for a reader (a long one keeps the log, as before).
int WalCheckpointer::OnCommit(void* self, sqlite3* writer, const char* db_name, int log_pages) {
  auto* c = static_cast<WalCheckpointer*>(self);
  if (log_pages < c->checkpoint_pages_) return SQLITE_OK;
  {
    absl::MutexLock lock(&c->mu_);
    c->wanted_ = true;
    if (log_pages < kWriterCheckpointFactor * c->checkpoint_pages_) return SQLITE_OK;
    c->writer_turn_ = true;
    c->mu_.Await(absl::Condition(
        +[](bool* running) { return !*running; }, &c->running_));
  }
  int rc = sqlite3_wal_checkpoint_v2(writer, db_name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  absl::MutexLock lock(&c->mu_);
  c->writer_turn_ = false;
  if (rc == SQLITE_OK) ++c->checkpoints_;
  return SQLITE_OK;
}

void WalCheckpointer::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WalCheckpointer::WantedOrStopping));
      if (stopping_) return;
      wanted_ = false;
      running_ = true;
    }
    int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
      DT_LOG(Warning) << "state database checkpoint failed: " << sqlite3_errmsg(db_)
                      << "; the write-ahead log grows until one succeeds";
    }
    absl::MutexLock lock(&mu_);
    running_ = false;
    if (rc == SQLITE_OK) ++checkpoints_;
  }
}

}  // namespace dt
