#include "coordinator/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/fs.h"

namespace dt {
namespace {

constexpr char kLockFile[] = "dtcoord.lock";
constexpr char kDatabaseFile[] = "dtcoord.db";
constexpr char kAdminTokenFile[] = "admin.token";

absl::Status Errno(const std::string& what, const std::string& path) {
  int e = errno;
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  return e == EACCES || e == EPERM ? absl::PermissionDeniedError(message) : absl::InternalError(message);
}

// A directory dtcoord did not create must already be private to this user.
absl::Status CheckPrivate(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Errno("cannot inspect state dir", path);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("state dir ", path, " is not a directory"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat("state dir ", path, " belongs to uid ", st.st_uid,
                                                      ", not to this user (uid ", ::geteuid(),
                                                      "): give dtcoord a directory of its own with --state-dir"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("state dir %s is writable by others (mode %04o) and would hold the admin token: give dtcoord a "
                        "directory of its own with --state-dir (it creates it 0700), or chmod 700 this one",
                        path, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::Status CheckStateNotLost(const std::string& path) {
  std::string token = JoinPath(path, kAdminTokenFile);
  std::string db = JoinPath(path, kDatabaseFile);
  struct stat st;
  if (::stat(token.c_str(), &st) != 0) return absl::OkStatus();  // a first start
  bool missing = ::stat(db.c_str(), &st) != 0;
  if (!missing && st.st_size > 0) return absl::OkStatus();
  // In WAL mode a database killed before its first checkpoint is an empty file and its journal.
  std::string wal = db + "-wal";
  if (!missing && ::stat(wal.c_str(), &st) == 0 && st.st_size > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the state database ", db, missing ? " is missing" : " is empty", " although ", token,
                   " shows this state dir was used before: the coordinator's state was lost (deleted, truncated or a "
                   "failed restore). Restore ",
                   kDatabaseFile,
                   " from a backup, or to start with no runs on purpose "
                   "remove ",
                   token, " as well"));
}

}  // namespace

absl::StatusOr<StateDir> StateDir::Open(const std::string& path) {
  struct stat st;
  bool existed = ::stat(path.c_str(), &st) == 0;
  if (!existed) {
    if (absl::Status s = MakeDirs(path); !s.ok()) return s;
    if (::chmod(path.c_str(), 0700) != 0) return Errno("cannot make private the state dir", path);
  }
  if (absl::Status s = CheckPrivate(path); !s.ok()) return s;
  std::string lock_path = JoinPath(path, kLockFile);
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno("cannot open the lock file", lock_path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char buf[512] = {0};
    ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    if (e != EWOULDBLOCK) {
      errno = e;
      return Errno("cannot lock", lock_path);
    }
    std::string holder(absl::StripAsciiWhitespace(absl::string_view(buf, n > 0 ? n : 0)));
    return absl::FailedPreconditionError(
        absl::StrCat("state dir ", path, " is in use by another dtcoord (", holder.empty() ? "still starting" : holder,
                     "): two coordinators on one state would each accept runs the other does not know. Stop that one, "
                     "or give this one another --state-dir"));
  }
  int dir_fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    ::close(fd);
    return Errno("cannot open the state dir", path);
  }
  if (::flock(dir_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    ::close(dir_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "state dir ", path, " is in use by another dtcoord (its ", kLockFile,
        " was removed, but that coordinator still holds the directory): two coordinators on one state would each "
        "accept runs the other does not know. Stop that one (fuser -v ",
        path,
        " names it), or give this one another "
        "--state-dir"));
  }
  StateDir dir(path, fd, dir_fd);
  if (absl::Status s = CheckStateNotLost(path); !s.ok()) return s;
  if (::ftruncate(fd, 0) != 0) return Errno("cannot write the lock file", lock_path);
  return dir;
}

StateDir::StateDir(StateDir&& other) noexcept
    : path_(std::move(other.path_)), lock_fd_(other.lock_fd_), dir_fd_(other.dir_fd_) {
  other.lock_fd_ = -1;
  other.dir_fd_ = -1;
}

StateDir& StateDir::operator=(StateDir&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    if (dir_fd_ >= 0) ::close(dir_fd_);
    path_ = std::move(other.path_);
    lock_fd_ = other.lock_fd_;
    dir_fd_ = other.dir_fd_;
    other.lock_fd_ = -1;
    other.dir_fd_ = -1;
  }
  return *this;
}

StateDir::~StateDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the locks
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

std::string StateDir::database_path() const { return JoinPath(path_, kDatabaseFile); }

absl::Status StateDir::Publish(const std::string& address) {
  std::string text = absl::StrCat("pid ", ::getpid(), " serving on ", address, "\n");
  if (::ftruncate(lock_fd_, 0) != 0 ||
      ::pwrite(lock_fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return Errno("cannot write the lock file", JoinPath(path_, kLockFile));
  }
  return absl::OkStatus();
}

}  // namespace dt
