// The experiment directory <save_dir>/<experiment_name>: created once per run with logs/ and
// checkpoints/; an existing one with a committed checkpoint means the run resumes from it.
// The coordinator reaches it only through held directory descriptors (common/dir_fd.h) and
// only while it is still the directory the run was given (same device and inode).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/dir_fd.h"
#include "dt/v1/common.pb.h"
#include "dt/v1/runs.pb.h"

namespace dt {

struct ExperimentDir {
  std::string path;  // canonical: the save dir with its links resolved, then the name
  std::string logs_dir;
  std::string checkpoints_dir;
  v1::ExperimentDirIdentity identity;
  bool created = false;                      // false: it existed before this run
  std::optional<v1::CheckpointInfo> resume;  // what `latest` names, if anything
};

// Validates the name and save dir (absolute, no "." or ".." components), creates the save dir
// when missing, resolves its links, and creates or opens the experiment directory itself (never
// through a link). Touches nothing inside it, so the caller can check first that no active run
// holds the same directory (same canonical path, or same device and inode).
//   INVALID_ARGUMENT     bad name or path
//   FAILED_PRECONDITION  the directory cannot be created, is not writable, or is a link
absl::StatusOr<ExperimentDir> ResolveExperimentDir(const std::string& save_dir, const std::string& experiment_name);

// Creates logs/ and checkpoints/, removes partial checkpoint directories left by dead writers,
// and finds the checkpoint to resume from (fills `dir.resume`).
//   FAILED_PRECONDITION  a part is a link or not a directory, or cannot be created
absl::Status PrepareExperimentDir(ExperimentDir& dir);

// Paths of an experiment directory without touching the disk.
ExperimentDir ExperimentPaths(const std::string& exp_dir);

// The run's experiment directory (`exp_dir` of the run, canonical) held open, provided it is
// still the directory with `identity` (an unset identity, from an older coordinator, is not
// checked).
//   NOT_FOUND            it was deleted
//   FAILED_PRECONDITION  it was moved away or replaced (by a link or another directory)
absl::StatusOr<DirFd> OpenExperimentDir(const std::string& exp_dir, const v1::ExperimentDirIdentity& identity);
// Its checkpoints/ directory, held open (never through a link).
absl::StatusOr<DirFd> OpenCheckpointsDir(const std::string& exp_dir, const v1::ExperimentDirIdentity& identity);

}  // namespace dt
