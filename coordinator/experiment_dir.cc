#include "coordinator/experiment_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/names.h"
#include "coordinator/checkpoint_publisher.h"

namespace dt {

ExperimentDir ExperimentPaths(const std::string& exp_dir) {
  ExperimentDir d;
  d.path = exp_dir;
  d.logs_dir = JoinPath(exp_dir, "logs");
  d.checkpoints_dir = JoinPath(exp_dir, "checkpoints");
  return d;
}

absl::StatusOr<ExperimentDir> PrepareExperimentDir(const std::string& save_dir,
                                                   const std::string& experiment_name) {
  if (absl::Status s = ValidateExperimentName(experiment_name); !s.ok()) return s;
  if (absl::Status s = ValidateAbsolutePath("save dir", save_dir); !s.ok()) return s;
  if (absl::Status s = MakeDirs(save_dir); !s.ok()) return s;
  if (!IsWritableDir(save_dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("save dir ", save_dir, " is not writable by the coordinator (uid ", ::getuid(), ")"));
  }
  ExperimentDir d = ExperimentPaths(JoinPath(save_dir, experiment_name));
  if (::mkdir(d.path.c_str(), 0755) == 0) {
    d.created = true;
    if (absl::Status s = FsyncDir(save_dir); !s.ok()) return s;
  } else if (errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create experiment directory ", d.path, ": ", std::strerror(errno)));
  } else if (!IsWritableDir(d.path)) {
    return absl::FailedPreconditionError(
        absl::StrCat(d.path, " exists and is not a writable directory"));
  }
  if (absl::Status s = MakeDirs(d.logs_dir); !s.ok()) return s;
  if (absl::Status s = MakeDirs(d.checkpoints_dir); !s.ok()) return s;
  absl::StatusOr<int> removed = RemovePartials(d.checkpoints_dir);
  if (!removed.ok()) return removed.status();
  if (*removed > 0) {
    DT_LOG(Info) << "removed " << *removed << " partial checkpoint director"
                 << (*removed == 1 ? "y" : "ies") << " in " << d.checkpoints_dir;
  }
  d.resume = FindLatest(d.checkpoints_dir);
  return d;
}

}  // namespace dt
