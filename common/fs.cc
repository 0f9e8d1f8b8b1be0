#include "common/fs.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/dir_fd.h"

namespace dt {
absl::Status ErrnoStatus(absl::string_view what, const std::string& path, int err) {
  std::string msg = absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EACCES || err == EPERM || err == EROFS) return absl::FailedPreconditionError(msg);
  return absl::InternalError(msg);
}

namespace {

absl::Status FsyncFd(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus("fsync", path, err);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return ErrnoStatus("read", path, EISDIR);
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus("read", path, errno ? errno : ENOENT);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string Basename(absl::string_view path) {
  size_t slash = path.find_last_of('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  while (!a.empty() && a.back() == '/' && a.size() > 1) a.remove_suffix(1);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a == "/") return absl::StrCat("/", b);
  return absl::StrCat(a, "/", b);
}

absl::Status FsyncDir(const std::string& dir) { return FsyncFd(dir, O_RDONLY | O_DIRECTORY); }

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents, mode_t mode) {
  absl::StatusOr<DirFd> dir = DirFd::Open(Dirname(path));
  if (!dir.ok()) return dir.status();
  return dir->WriteFileAtomic(path.substr(path.find_last_of('/') + 1), contents, mode);
}

int WriteFully(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    ssize_t n = ::write(fd, p + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) return ErrnoStatus("resolve", path, errno);
  return std::string(resolved);
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create directory ", path, ": ", ec.message()));
  }
  if (!std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

bool IsWritableDir(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  return ::access(dir.c_str(), W_OK | X_OK) == 0;
}

}  // namespace dt
