#include "common/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"

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

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  while (!a.empty() && a.back() == '/' && a.size() > 1) a.remove_suffix(1);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a == "/") return absl::StrCat("/", b);
  return absl::StrCat(a, "/", b);
}

absl::Status FsyncFile(const std::string& path) { return FsyncFd(path, O_RDONLY); }

absl::Status FsyncDir(const std::string& dir) { return FsyncFd(dir, O_RDONLY | O_DIRECTORY); }

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents, mode_t mode) {
  std::string tmp = absl::StrCat(path, ".tmp-", RandomHex(4));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus("create", tmp, errno);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoStatus("fsync", tmp, err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("rename into", path, err);
  }
  return FsyncDir(Dirname(path));
}

absl::Status ReplaceSymlink(const std::string& target, const std::string& link) {
  std::string tmp = absl::StrCat(link, ".tmp-", RandomHex(4));
  if (::symlink(target.c_str(), tmp.c_str()) != 0) return ErrnoStatus("symlink", tmp, errno);
  if (::rename(tmp.c_str(), link.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("rename into", link, err);
  }
  return FsyncDir(Dirname(link));
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", path, ": ", ec.message()));
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
