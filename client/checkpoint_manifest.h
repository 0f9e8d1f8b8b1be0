// The manifest a checkpoint writer commits for a directory its program saved into (a LibTorch
// program under dtrun: torch::save into BeginCheckpoint's partial_dir, then this).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "dt/v1/checkpoint.pb.h"

namespace dt {

// Each plain file of `dir` with its size and SHA-256, by name. FAILED_PRECONDITION for a
// subdirectory, a link or anything else that is not a regular file (the coordinator publishes
// plain files only), or for an empty directory.
absl::StatusOr<v1::Manifest> ManifestOfDirectory(const std::string& dir);

}  // namespace dt
