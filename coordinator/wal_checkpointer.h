// Checkpoints the state database's write-ahead log on a thread of its own.
//
// SQLite's default moves the WAL's pages into the database file inside the commit that takes the
// WAL past 1,000 pages (4 MB of its default pages; this threshold is those 4 MB, whatever the page size), on the
// committing connection: under metric ingest that was the writer, holding the state database's lock, copying pages and
// syncing. With the checkpointer, a commit past the threshold only wakes this thread, which checkpoints on a second
// connection while the writer goes on (SQLite's PASSIVE mode). The log starts over at the first commit after a
// checkpoint caught up with it. A writer that never pauses long enough for that checkpoints
// itself once the log reaches 16 times the threshold, which bounds it while no reader holds the
// log (a read that lasts keeps it growing, as with SQLite's own checkpoints). Durability is
// unchanged: a commit is in the WAL either way.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dt {

class WalCheckpointer {
 public:
  // Opens a connection to `path` of its own and takes over checkpointing from `writer` (its WAL
  // hook). The caller serialises calls on `writer`, this one included.
  // Errors: FAILED_PRECONDITION when `path` cannot be opened.
  static absl::StatusOr<std::unique_ptr<WalCheckpointer>> Start(const std::string& path, sqlite3* writer);
  // Stops the thread and closes its connection. `writer` must still be open.
  ~WalCheckpointer();
  WalCheckpointer(const WalCheckpointer&) = delete;
  WalCheckpointer& operator=(const WalCheckpointer&) = delete;

  // Checkpoints that succeeded so far (for tests).
  int64_t checkpoints() const;

 private:
  WalCheckpointer(sqlite3* db, sqlite3* writer, int checkpoint_pages);
  static int OnCommit(void* self, sqlite3* writer, const char* db_name, int log_pages);
  void Loop();
  bool WantedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  sqlite3* const db_;           // used by the thread only
  sqlite3* const writer_;       // its hook is ours until the destructor
  const int checkpoint_pages_;  // the log's length that wakes the thread: 4 MB of the database's pages
  mutable absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;      // the thread is in a checkpoint
  bool writer_turn_ ABSL_GUARDED_BY(mu_) = false;  // the writer checkpoints, or waits to
  int64_t checkpoints_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace dt
