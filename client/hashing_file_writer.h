// A checkpoint file written through one descriptor and hashed as it is written: the writer's
// single pass over bytes it already holds replaces the coordinator's re-read (DESIGN.md §4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dt/v1/checkpoint.pb.h"

namespace dt {

class BackgroundSha256;

// Creates (or truncates) `path`. Large writes are hashed on a helper thread while the caller
// writes the same piece, so the SHA-256 and the kernel's copy run on two cores and read each
// piece from memory once. Write never fails towards its caller — torch's archive writer throws
// from a destructor when a write comes up short, which ends the process (SIGABRT) — but keeps the
// first error, which Finish returns: "no space left on device" with the path (RESOURCE_EXHAUSTED),
// or the system's message.
class HashingFileWriter {
 public:
  explicit HashingFileWriter(std::string path);
  ~HashingFileWriter();
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  // Writes and hashes `n` bytes; returns `n` (the archive writer's contract), whatever happened.
  size_t Write(const void* data, size_t n);
  // fsyncs and describes the file for the manifest as `name`, or returns the first error.
  absl::StatusOr<v1::ManifestFile> Finish(const std::string& name);

 private:
  void Fail(int err);

  std::string path_;
  int fd_ = -1;
  absl::Status error_;
  std::unique_ptr<BackgroundSha256> hash_;
  int64_t bytes_ = 0;
};

// Writes `data` to dir/name through a HashingFileWriter, fsyncs, and describes it.
absl::StatusOr<v1::ManifestFile> WriteHashed(const std::string& dir, const std::string& name, const std::string& data);

}  // namespace dt
