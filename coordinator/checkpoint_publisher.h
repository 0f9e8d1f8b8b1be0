// The file-system half of checkpoint leadership: verify a writer's files against its manifest,
// publish the directory atomically, point `latest` at it, keep the last K, and clean up partial
// directories. Invariant: `checkpoints/latest` names a complete, checksummed checkpoint or nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dir_fd.h"
#include "common/limits.h"
#include "dt/v1/checkpoint.pb.h"
#include "dt/v1/common.pb.h"

namespace dt {

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kLatestLink[] = "latest";

std::string CheckpointDirName(int64_t step);                         // "step-<step>"
std::string PartialDirName(int64_t step, const std::string& nonce);  // "step-<step>.partial-<nonce>"

// INVALID_ARGUMENT for a malformed manifest (names with '/', duplicates, bad sizes or digests,
// more than `max_files` files, or none unless `allow_empty`: a sharded round's rank may hold no
// state, a round as a whole must write something).
absl::Status ValidateManifest(const v1::Manifest& manifest, size_t max_files = kMaxCheckpointFiles,
                              bool allow_empty = false);

// Who wrote a round's files, for manifest.json: `file_ranks` by manifest index (every file the
// writer's when the round has one writer), the generation's size and the program's layout document.
struct RoundWriters {
  bool sharded = false;
  int world_size = 0;
  int writer_rank = 0;          // single-writer rounds
  std::vector<int> file_ranks;  // sharded rounds, by manifest index
  std::string layout_json;      // sharded rounds: validated JSON, or empty
};

// The functions below work inside a held `checkpoints/` directory and never follow a link in
// it: a planted link is refused (FAILED_PRECONDITION or DATA_LOSS naming the entry), never read,
// written through or deleted through.

// How much the coordinator checks before it publishes a round. The writer hashed every file as it
// wrote it; the digests go into manifest.json either way, and the rank that loads a checkpoint
// verifies them (as does `dtctl checkpoints RUN --verify`).
enum class CheckpointVerification {
  kSizes,    // each listed file present, a regular file, of the manifest's size (no read)
  kDigests,  // also re-read and hash every byte (the coordinator's own check of the writer)
};

// Verifies that the partial directory `partial_name` holds exactly the manifest's files, each a
// regular file with the manifest's size (and, with kDigests, its SHA-256; DATA_LOSS naming the
// first mismatch), writes manifest.json (with each file's rank, the world size and the layout),
// renames the directory to step-<step>, fsyncs, and points `latest` at it. Returns the published
// checkpoint (its generation, writer and shards are the caller's to fill in).
absl::StatusOr<v1::CheckpointInfo> VerifyAndPublish(const DirFd& checkpoints, const std::string& partial_name,
                                                    int64_t step, const v1::Manifest& manifest,
                                                    const RoundWriters& writers, CheckpointVerification verification);

// Sets info.shards: each rank's file count and bytes, by rank, from (rank, bytes) per file.
void SetShards(v1::CheckpointInfo& info, const std::vector<std::pair<int, int64_t>>& file_ranks_and_bytes);

// Removes every step-<N> directory whose step is not in `keep` and is older than the newest kept
// (nothing when `keep` is empty).
absl::Status ApplyRetention(const DirFd& checkpoints, const std::vector<int64_t>& keep);

// Removes every *.partial-* entry (nothing reads them; a dead writer leaves them behind).
// Returns how many were removed, or the first error (after trying every entry).
absl::StatusOr<int> RemovePartials(const DirFd& checkpoints);

// Removes an aborted round's partial directory `partial_name` (gone already: OK). It is renamed
// aside first, so a rank still writing into the round by path gets ENOENT instead of adding a
// file the removal would miss (the directory would then be left, not empty). The new name keeps
// ".partial-", so whatever a failure leaves is removed with the other partials at start-up.
absl::Status RemoveAbortedPartial(const DirFd& checkpoints, const std::string& partial_name);

// The checkpoint `latest` names, if it exists and its manifest's sizes match the files (the
// trainer verifies checksums when it loads). Used when an experiment directory is reused.
std::optional<v1::CheckpointInfo> FindLatest(const DirFd& checkpoints);

}  // namespace dt
