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

// Re-reads every file a published checkpoint's manifest.json lists and checks its size and the
// SHA-256 its writer computed while writing it. DATA_LOSS naming the first file that differs (or a
// missing or malformed manifest). The rank that loads a checkpoint runs this first; so does
// `dtctl checkpoints RUN --verify`. Returns the bytes checked.
absl::StatusOr<int64_t> VerifyCheckpointDirectory(const std::string& dir);

}  // namespace dt
