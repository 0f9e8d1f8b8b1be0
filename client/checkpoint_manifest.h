// The manifest a checkpoint writer commits for a directory its program saved into (a LibTorch
// program under dtrun: torch::save into BeginCheckpoint's partial_dir, then this), and the check
// of a published checkpoint against the manifest.json the coordinator wrote into it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dt/v1/checkpoint.pb.h"

namespace dt {

// Each plain file of `dir` with its size and SHA-256, by name. FAILED_PRECONDITION for a
// subdirectory, a link or anything else that is not a regular file (the coordinator publishes
// plain files only), or for an empty directory.
absl::StatusOr<v1::Manifest> ManifestOfDirectory(const std::string& dir);

// The manifest of one rank's files `names` inside a sharded round's shared `dir` (none is
// allowed: a rank may hold no state). INVALID_ARGUMENT for a name that is not a plain file name;
// FAILED_PRECONDITION for a name that is missing or not a regular file.
absl::StatusOr<v1::Manifest> ManifestOfFiles(const std::string& dir, std::vector<std::string> names);

// A published checkpoint's files as its manifest.json lists them, each found on disk at its size.
// A reader re-reads and checks the SHA-256 of the files it reads (Verify), not of every rank's:
// on resume, a ZeRO-1 rank hashes the model and its own share of the moments, not the others'.
class CheckpointFiles {
 public:
  // DATA_LOSS for a missing or malformed manifest.json, or a listed file missing or of another
  // size than listed (what a torn copy or a full disk leaves).
  static absl::StatusOr<CheckpointFiles> Open(const std::string& dir);
  // Re-reads `name` and checks it against the SHA-256 its writer computed while writing it.
  // DATA_LOSS naming the file when it differs or is not listed in the manifest.
  absl::Status Verify(const std::string& name) const;
  // Every listed file's name, in the manifest's order.
  std::vector<std::string> names() const;
  int64_t total_bytes() const { return total_bytes_; }

 private:
  struct File {
    std::string name;
    int64_t size = 0;
    std::string sha256;
  };
  std::string dir_;
  std::vector<File> files_;
  int64_t total_bytes_ = 0;
};

// Every file of a published checkpoint found and verified (CheckpointFiles::Verify): `dtctl
// checkpoints RUN --verify` runs this. DATA_LOSS naming the first file that differs (or a missing
// or malformed manifest). Returns the bytes checked.
absl::StatusOr<int64_t> VerifyCheckpointDirectory(const std::string& dir);

}  // namespace dt
