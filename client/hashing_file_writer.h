// A checkpoint file written through one descriptor and hashed as it is written: the writer's
// single pass over bytes it already holds replaces the coordinator's re-read (DESIGN.md §4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/file_write_mode.h"
#include "dt/v1/checkpoint.pb.h"

namespace dt {

class BackgroundSha256;

// Creates (or truncates) `path` and writes it in `mode`. Where the file system refuses O_DIRECT
// (tmpfs, at open or at the first write) a direct file is written through the page cache; where
// it has no write-back to start (sync_file_range refused), a write-behind file is left to fsync.
// Each buffer (or, through the page cache, each large piece) is hashed on a helper thread while
// the caller writes it, so the SHA-256 and the write run side by side and read each piece from
// memory once. Write never fails towards its caller — torch's archive writer throws from a
// destructor when a write comes up short, which ends the process (SIGABRT) — but keeps the first
// error, which Finish returns: "no space left on device" with the path (RESOURCE_EXHAUSTED), or
// the system's message.
class HashingFileWriter {
 public:
  explicit HashingFileWriter(std::string path, FileWriteMode mode = FileWriteMode::kWriteBehind);
  ~HashingFileWriter();
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  // Writes and hashes `n` bytes; returns `n` (the archive writer's contract), whatever happened.
  size_t Write(const void* data, size_t n);
  // Writes what is buffered, fsyncs and describes the file for the manifest as `name`, or returns
  // the first error.
  absl::StatusOr<v1::ManifestFile> Finish(const std::string& name);

  // Whether the file is being written around the page cache (kDirect, where allowed).
  bool direct() const { return direct_; }
  // Whether the file's write-back is being started and its pages dropped as it is written
  // (kWriteBehind, where the file system has write-back to start).
  bool writing_behind() const { return write_behind_; }

  // Write-behind's range: large enough that one sync_file_range queues plenty for the disk,
  // small enough that the ranges in flight are a small share of the page cache.
  static constexpr int64_t kWriteBehindRange = 8 << 20;
  // Ranges started but not yet waited for and dropped, at most, between writes.
  static constexpr int64_t kWriteBehindRangesInFlight = 2;

  // The aligned buffer's size: whole blocks for O_DIRECT, large enough that one write keeps the
  // disk busy (4 MiB wrote 1.26 GB in 0.86 s here, 1 MiB in 0.99 s, 16 MiB in 1.05 s).
  static constexpr size_t kDirectBuffer = 4 << 20;

 private:
  void Fail(int err);
  // Hashes [data, data + n) (on the helper thread when large) while writing it at the file's end.
  int HashAndWrite(const char* data, size_t n);
  // write(2) of all of [data, data + n); a direct write the file system refuses (EINVAL) turns
  // O_DIRECT off and goes through the page cache. 0 or the errno.
  int WriteAll(const char* data, size_t n);
  // Turns O_DIRECT off for the rest of the file (a tail that is not whole blocks, or a refusal).
  void StopDirect();
  // Write-behind after bytes_ grew: starts the write-back of each range now filled, then waits
  // for and drops the ranges more than kWriteBehindRangesInFlight behind. 0 or the errno of a
  // write-back that failed.
  int WriteBehind();

  struct FreeBuffer {
    void operator()(char* p) const;
  };

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  bool write_behind_ = false;
  int64_t started_ = 0;                       // write-behind: bytes whose write-back has been started
  int64_t dropped_ = 0;                       // write-behind: bytes on disk and out of the page cache
  std::unique_ptr<char, FreeBuffer> buffer_;  // kDirectBuffer bytes, page-aligned, while direct_
  size_t buffered_ = 0;
  absl::Status error_;
  std::unique_ptr<BackgroundSha256> hash_;
  int64_t bytes_ = 0;  // written to the file (and hashed)
};

// Writes `data` to dir/name through a HashingFileWriter, fsyncs, and describes it.
absl::StatusOr<v1::ManifestFile> WriteHashed(const std::string& dir, const std::string& name, const std::string& data);

}  // namespace dt
