#include "coordinator/experiment_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/names.h"
#include "coordinator/checkpoint_publisher.h"

namespace dt {
namespace {

constexpr char kLogsDir[] = "logs";
constexpr char kCheckpointsDir[] = "checkpoints";

absl::Status RefuseDotComponents(const std::string& save_dir) {
  for (absl::string_view part : absl::StrSplit(save_dir, '/')) {
    if (part == "." || part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("save dir ", Quote(save_dir), " has a \"", part,
                       "\" component; give the directory without \".\" or \"..\" (one directory, one spelling)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

ExperimentDir ExperimentPaths(const std::string& exp_dir) {
  ExperimentDir d;
  d.path = exp_dir;
  d.logs_dir = JoinPath(exp_dir, kLogsDir);
  d.checkpoints_dir = JoinPath(exp_dir, kCheckpointsDir);
  return d;
}

absl::StatusOr<ExperimentDir> ResolveExperimentDir(const std::string& save_dir, const std::string& experiment_name) {
  if (absl::Status s = ValidateExperimentName(experiment_name); !s.ok()) return s;
  if (absl::Status s = ValidateAbsolutePath("save dir", save_dir); !s.ok()) return s;
  if (absl::Status s = RefuseDotComponents(save_dir); !s.ok()) return s;
  if (absl::Status s = MakeDirs(save_dir); !s.ok()) return s;
  absl::StatusOr<std::string> canonical = RealPath(save_dir);
  if (!canonical.ok()) return absl::FailedPreconditionError(canonical.status().message());
  if (!IsWritableDir(*canonical)) {
    return absl::FailedPreconditionError(
        absl::StrCat("save dir ", *canonical, " is not writable by the coordinator (uid ", ::getuid(), ")"));
  }
  absl::StatusOr<DirFd> parent = DirFd::Open(*canonical);
  if (!parent.ok()) return absl::FailedPreconditionError(parent.status().message());
  ExperimentDir d = ExperimentPaths(JoinPath(*canonical, experiment_name));
  d.created = !parent->Lstat(experiment_name).ok();
  absl::StatusOr<DirFd> exp = parent->MakeSub(experiment_name);
  if (!exp.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot use experiment directory ", d.path, ": ", exp.status().message()));
  }
  if (::faccessat(exp->fd(), ".", W_OK | X_OK, 0) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(d.path, " exists and is not writable"));
  }
  if (d.created) {
    if (absl::Status s = parent->Fsync(); !s.ok()) return s;
  }
  d.identity.set_device(exp->device());
  d.identity.set_inode(exp->inode());
  return d;
}

absl::Status PrepareExperimentDir(ExperimentDir& d) {
  absl::StatusOr<DirFd> exp = OpenExperimentDir(d.path, d.identity);
  if (!exp.ok()) return absl::FailedPreconditionError(exp.status().message());
  if (absl::StatusOr<DirFd> logs = exp->MakeSub(kLogsDir); !logs.ok()) {
    return absl::FailedPreconditionError(logs.status().message());
  }
  absl::StatusOr<DirFd> checkpoints = exp->MakeSub(kCheckpointsDir);
  if (!checkpoints.ok()) return absl::FailedPreconditionError(checkpoints.status().message());
  absl::StatusOr<int> removed = RemovePartials(*checkpoints);
  if (!removed.ok()) {
    // Leftovers are never read: a run may start beside one that cannot be removed.
    DT_LOG(Warning) << "partial checkpoint directories in " << d.checkpoints_dir
                    << " not all removed: " << removed.status().message();
  } else if (*removed > 0) {
    DT_LOG(Info) << "removed " << *removed << " partial checkpoint director" << (*removed == 1 ? "y" : "ies") << " in "
                 << d.checkpoints_dir;
  }
  d.resume = FindLatest(*checkpoints);
  return absl::OkStatus();
}

absl::StatusOr<DirFd> OpenExperimentDir(const std::string& exp_dir, const v1::ExperimentDirIdentity& identity) {
  absl::StatusOr<DirFd> parent = DirFd::Open(Dirname(exp_dir));
  if (!parent.ok()) return parent.status();
  std::string name = exp_dir.substr(exp_dir.find_last_of('/') + 1);
  absl::StatusOr<DirFd> exp = parent->Sub(name);
  if (!exp.ok()) {
    if (absl::IsNotFound(exp.status())) {
      return absl::NotFoundError(absl::StrCat("experiment directory ", exp_dir, " was deleted"));
    }
    return exp.status();
  }
  bool checked = identity.device() != 0 || identity.inode() != 0;
  if (checked && (exp->device() != identity.device() || exp->inode() != identity.inode())) {
    return absl::FailedPreconditionError(
        absl::StrCat("experiment directory ", exp_dir,
                     " is no longer the directory this run was given (it was moved away or replaced); "
                     "the coordinator does not write into it"));
  }
  return exp;
}

absl::StatusOr<DirFd> OpenCheckpointsDir(const std::string& exp_dir, const v1::ExperimentDirIdentity& identity) {
  absl::StatusOr<DirFd> exp = OpenExperimentDir(exp_dir, identity);
  if (!exp.ok()) return exp.status();
  return exp->Sub(kCheckpointsDir);
}

}  // namespace dt
