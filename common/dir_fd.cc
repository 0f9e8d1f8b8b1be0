#include "common/dir_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/fs.h"

namespace dt {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

absl::Status ValidatePathComponent(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, '/') || absl::StrContains(name, '\0')) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", name, "\" is not a single file name (no '/', not '.' or '..')"));
  }
  return absl::OkStatus();
}

namespace {

std::string NameString(absl::string_view name) { return std::string(name); }

// What an entry that should have been a `wanted` is instead, for messages.
std::string KindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a device";
}

absl::Status NotA(const std::string& path, mode_t mode, absl::string_view wanted) {
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is ", KindOf(mode), ", not ", wanted,
                   S_ISLNK(mode) ? " (links inside a run's directory are never followed)" : ""));
}

}  // namespace

DirFd::DirFd(UniqueFd fd, std::string path, const struct stat& st)
    : fd_(std::move(fd)), path_(std::move(path)), device_(st.st_dev), inode_(st.st_ino) {}

std::string DirFd::PathOf(absl::string_view name) const { return JoinPath(path_, name); }

absl::StatusOr<DirFd> DirFd::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    if (err == ENOTDIR) return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
    return ErrnoStatus("open directory", path, err);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat", path, errno);
  return DirFd(std::move(fd), path, st);
}

absl::StatusOr<DirFd> DirFd::Sub(absl::string_view name) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  std::string path = PathOf(name);
  UniqueFd fd(::openat(fd_.get(), NameString(name).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      absl::StatusOr<struct stat> st = Lstat(name);
      if (st.ok()) return NotA(path, st->st_mode, "a directory");
    }
    return ErrnoStatus("open directory", path, err);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat", path, errno);
  return DirFd(std::move(fd), path, st);
}

absl::StatusOr<DirFd> DirFd::MakeSub(absl::string_view name, mode_t mode) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  if (::mkdirat(fd_.get(), NameString(name).c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoStatus("create directory", PathOf(name), errno);
  }
  return Sub(name);
}

absl::StatusOr<std::vector<DirFd::Entry>> DirFd::List() const {
  // A description of its own: readdir moves the offset, which a dup() would share.
  int fd = ::openat(fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("list", path_, errno);
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("list", path_, err);
  }
  std::vector<Entry> entries;
  errno = 0;
  while (struct dirent* d = ::readdir(dir)) {
    std::string name = d->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone since
    entries.push_back({name, static_cast<mode_t>(st.st_mode & S_IFMT)});
    errno = 0;
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return ErrnoStatus("list", path_, err);
  return entries;
}

absl::StatusOr<struct stat> DirFd::Lstat(absl::string_view name) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  struct stat st;
  if (::fstatat(fd_.get(), NameString(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoStatus("stat", PathOf(name), errno);
  }
  return st;
}

absl::StatusOr<UniqueFd> DirFd::OpenRegularFile(absl::string_view name) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  std::string path = PathOf(name);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  UniqueFd fd(::openat(fd_.get(), NameString(name).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    if (err == ELOOP) return NotA(path, S_IFLNK, "a regular file");
    return ErrnoStatus("open", path, err);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat", path, errno);
  if (!S_ISREG(st.st_mode)) return NotA(path, st.st_mode, "a regular file");
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus("open", path, errno);
  }
  return fd;
}

absl::StatusOr<std::string> DirFd::ReadFile(absl::string_view name, size_t max_bytes) const {
  absl::StatusOr<UniqueFd> fd = OpenRegularFile(name);
  if (!fd.ok()) return fd.status();
  std::string path = PathOf(name);
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return ErrnoStatus("stat", path, errno);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", st.st_size, " bytes; at most ", max_bytes, " are read"));
  }
  std::string out;
  char buffer[64 << 10];
  while (out.size() <= max_bytes) {
    ssize_t n = ::read(fd->get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read", path, errno);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  if (out.size() > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(path, " grew past ", max_bytes, " bytes while read"));
  }
  return out;
}

absl::StatusOr<DirFd::Tail> DirFd::ReadTail(absl::string_view name, size_t max_bytes) const {
  absl::StatusOr<UniqueFd> fd = OpenRegularFile(name);
  if (!fd.ok()) return fd.status();
  std::string path = PathOf(name);
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return ErrnoStatus("stat", path, errno);
  Tail tail;
  tail.file_size = st.st_size;
  off_t from = std::max<off_t>(0, st.st_size - static_cast<off_t>(max_bytes));
  tail.bytes.resize(static_cast<size_t>(st.st_size - from));
  size_t got = 0;
  while (got < tail.bytes.size()) {
    ssize_t n = ::pread(fd->get(), tail.bytes.data() + got, tail.bytes.size() - got, from + static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read", path, errno);
    }
    if (n == 0) break;  // truncated meanwhile
    got += static_cast<size_t>(n);
  }
  tail.bytes.resize(got);
  return tail;
}

absl::Status DirFd::WriteFileAtomic(absl::string_view name, absl::string_view contents, mode_t mode) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  std::string tmp = absl::StrCat(".", name, ".tmp-", RandomHex(4));
  UniqueFd fd(::openat(fd_.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd.valid()) return ErrnoStatus("create", PathOf(tmp), errno);
  auto fail = [&](absl::string_view what, int err) {
    ::unlinkat(fd_.get(), tmp.c_str(), 0);
    return ErrnoStatus(what, PathOf(name), err);
  };
  if (int err = WriteFully(fd.get(), contents.data(), contents.size()); err != 0) return fail("write", err);
  if (::fchmod(fd.get(), mode) != 0 || ::fsync(fd.get()) != 0) return fail("fsync", errno);
  if (::renameat(fd_.get(), tmp.c_str(), fd_.get(), NameString(name).c_str()) != 0) {
    return fail("rename into", errno);
  }
  return Fsync();
}

absl::Status DirFd::ReplaceSymlink(absl::string_view target, absl::string_view name) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  std::string tmp = absl::StrCat(".", name, ".tmp-", RandomHex(4));
  if (::symlinkat(NameString(target).c_str(), fd_.get(), tmp.c_str()) != 0) {
    return ErrnoStatus("create link", PathOf(tmp), errno);
  }
  if (::renameat(fd_.get(), tmp.c_str(), fd_.get(), NameString(name).c_str()) != 0) {
    int err = errno;
    ::unlinkat(fd_.get(), tmp.c_str(), 0);
    return ErrnoStatus("rename into", PathOf(name), err);
  }
  return Fsync();
}

absl::StatusOr<std::string> DirFd::ReadLink(absl::string_view name) const {
  if (absl::Status s = ValidatePathComponent(name); !s.ok()) return s;
  char target[4096];
  ssize_t n = ::readlinkat(fd_.get(), NameString(name).c_str(), target, sizeof(target));
  if (n < 0) {
    int err = errno;
    if (err == EINVAL) return absl::FailedPreconditionError(absl::StrCat(PathOf(name), " is not a symbolic link"));
    return ErrnoStatus("read link", PathOf(name), err);
  }
  if (static_cast<size_t>(n) == sizeof(target)) {
    return absl::FailedPreconditionError(absl::StrCat(PathOf(name), " points at an over-long target"));
  }
  return std::string(target, static_cast<size_t>(n));
}

absl::Status DirFd::Rename(absl::string_view from, absl::string_view to) const {
  if (absl::Status s = ValidatePathComponent(from); !s.ok()) return s;
  if (absl::Status s = ValidatePathComponent(to); !s.ok()) return s;
  if (::renameat(fd_.get(), NameString(from).c_str(), fd_.get(), NameString(to).c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("rename ", PathOf(from), " to"), PathOf(to), errno);
  }
  return absl::OkStatus();
}

absl::Status DirFd::RemoveTree(absl::string_view name) const { return RemoveTreeAt(name, 0); }

absl::Status DirFd::RemoveTreeAt(absl::string_view name, int depth) const {
  // Whoever can write in a run's tree can nest directories without end: bounded, so neither the
  // stack nor the descriptors run out.
  constexpr int kMaxDepth = 64;
  if (depth > kMaxDepth) {
    return absl::FailedPreconditionError(
        absl::StrCat(PathOf(name), " is nested more than ", kMaxDepth, " directories deep; not removed"));
  }
  absl::StatusOr<struct stat> st = Lstat(name);
  if (!st.ok()) return absl::IsNotFound(st.status()) ? absl::OkStatus() : st.status();
  std::string n = NameString(name);
  if (S_ISDIR(st->st_mode)) {
    absl::StatusOr<DirFd> sub = Sub(name);
    if (!sub.ok()) return absl::IsNotFound(sub.status()) ? absl::OkStatus() : sub.status();
    absl::StatusOr<std::vector<Entry>> entries = sub->List();
    if (!entries.ok()) return entries.status();
    for (const Entry& e : *entries) {
      if (absl::Status s = sub->RemoveTreeAt(e.name, depth + 1); !s.ok()) return s;
    }
    if (::unlinkat(fd_.get(), n.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return ErrnoStatus("remove", PathOf(name), errno);
    }
    return absl::OkStatus();
  }
  if (::unlinkat(fd_.get(), n.c_str(), 0) != 0 && errno != ENOENT) {
    return ErrnoStatus("remove", PathOf(name), errno);
  }
  return absl::OkStatus();
}

absl::Status DirFd::Fsync() const {
  if (::fsync(fd_.get()) != 0) return ErrnoStatus("fsync", path_, errno);
  return absl::OkStatus();
}

}  // namespace dt
