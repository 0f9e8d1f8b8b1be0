// The experiment directory <save_dir>/<experiment_name>: created once per run with logs/ and
// checkpoints/; an existing one with a committed checkpoint means the run resumes from it.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dt/v1/common.pb.h"

namespace dt {

struct ExperimentDir {
  std::string path;
  std::string logs_dir;
  std::string checkpoints_dir;
  bool created = false;                      // false: it existed before this run
  std::optional<v1::CheckpointInfo> resume;  // what `latest` names, if anything
};

// Validates the name and save dir, creates what is missing, removes partial checkpoint
// directories left by dead writers, and finds the checkpoint to resume from.
//   INVALID_ARGUMENT     bad name or path
//   FAILED_PRECONDITION  the directory cannot be created or is not writable
absl::StatusOr<ExperimentDir> PrepareExperimentDir(const std::string& save_dir,
                                                   const std::string& experiment_name);

// Paths of an experiment directory without touching the disk.
ExperimentDir ExperimentPaths(const std::string& exp_dir);

}  // namespace dt
