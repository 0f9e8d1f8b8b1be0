// The coordinator's state directory, held by one dtcoord at a time. Two coordinators serving one
// state dir would each accept runs the other does not know (split brain), so the first takes an
// exclusive lock (flock on <dir>/dtcoord.lock, released by the kernel however the process ends)
// and the second is refused with the first's pid and address. The directory must be private (it
// holds admin.token): one dtcoord creates is 0700; an existing one that others can write to is
// refused rather than silently re-moded. A state database that is missing or empty while
// admin.token exists means the state was lost: refused, not silently started empty.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dt {

class StateDir {
 public:
  // Creates (0700) or checks the directory, takes the lock and checks the database file.
  //   FAILED_PRECONDITION: held by another dtcoord (message: its pid and address), shared with
  //   other users, or state lost; INTERNAL/PERMISSION_DENIED from the file system.
  static absl::StatusOr<StateDir> Open(const std::string& path);
  StateDir(StateDir&& other) noexcept;
  StateDir& operator=(StateDir&& other) noexcept;
  ~StateDir();

  const std::string& path() const { return path_; }
  std::string database_path() const;
  // Records this process's pid and serving address in the lock file, for the message a second
  // dtcoord prints.
  absl::Status Publish(const std::string& address);

 private:
  StateDir(std::string path, int lock_fd, int dir_fd) : path_(std::move(path)), lock_fd_(lock_fd), dir_fd_(dir_fd) {}
  std::string path_;
  int lock_fd_ = -1;
  // The directory itself, flocked too: deleting dtcoord.lock by hand does not let a second
  // coordinator in.
  int dir_fd_ = -1;
};

}  // namespace dt
