// A directory held open by descriptor. Everything below it is reached with openat()/…at() and
// O_NOFOLLOW, one component at a time, so a symbolic link planted inside (by anyone who can
// write there) never leads the holder outside the tree, and renaming the tree's path away does
// not redirect work already holding it. The coordinator reaches every run's directories this way.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dt {

// An owned file descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class DirFd {
 public:
  struct Entry {
    std::string name;
    mode_t type;  // S_IFDIR, S_IFREG, S_IFLNK, … from lstat (a link is reported as a link)
  };

  // Opens `path`, following links in it: the caller trusts the path itself (an admin's save
  // dir may well be a link to scratch storage). NOT_FOUND, FAILED_PRECONDITION (not a directory,
  // no permission).
  static absl::StatusOr<DirFd> Open(const std::string& path);

  // The directory `name` (one path component) inside this one, never through a link.
  //   INVALID_ARGUMENT     `name` is empty, ".", "..", or has a '/'
  //   NOT_FOUND            it does not exist
  //   FAILED_PRECONDITION  it is a symbolic link or not a directory
  absl::StatusOr<DirFd> Sub(absl::string_view name) const;
  // Sub(), creating the directory first when it is missing.
  absl::StatusOr<DirFd> MakeSub(absl::string_view name, mode_t mode = 0755) const;

  // Every entry but "." and "..", with its type as lstat gives it.
  absl::StatusOr<std::vector<Entry>> List() const;
  // lstat of an entry; NOT_FOUND when it does not exist.
  absl::StatusOr<struct stat> Lstat(absl::string_view name) const;

  // Opens a regular file for reading, never through a link and never blocking on a FIFO.
  //   NOT_FOUND, FAILED_PRECONDITION (a link, a directory, a device, a FIFO…)
  absl::StatusOr<UniqueFd> OpenRegularFile(absl::string_view name) const;
  // A regular file's contents; FAILED_PRECONDITION when it is larger than `max_bytes`.
  absl::StatusOr<std::string> ReadFile(absl::string_view name, size_t max_bytes) const;

  // The last `max_bytes` of a regular file (a log being appended to), and its size then.
  struct Tail {
    std::string bytes;
    int64_t file_size = 0;
  };
  absl::StatusOr<Tail> ReadTail(absl::string_view name, size_t max_bytes) const;

  // Writes a temporary file here, fsyncs it, renames it over `name` and fsyncs this directory.
  absl::Status WriteFileAtomic(absl::string_view name, absl::string_view contents, mode_t mode = 0644) const;
  // Points the symbolic link `name` at `target` atomically (a link is only ever created, never
  // followed).
  absl::Status ReplaceSymlink(absl::string_view target, absl::string_view name) const;
  // The target of the link `name`; FAILED_PRECONDITION when it is not a link.
  absl::StatusOr<std::string> ReadLink(absl::string_view name) const;
  // renameat within this directory.
  absl::Status Rename(absl::string_view from, absl::string_view to) const;
  // rm -rf of an entry without following any link below it (a link is removed, not its
  // target). OK when the entry does not exist; FAILED_PRECONDITION for a tree nested more than
  // 64 directories deep (checkpoints are flat; nothing legitimate is that deep).
  absl::Status RemoveTree(absl::string_view name) const;
  absl::Status Fsync() const;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }  // how it was reached, for messages
  uint64_t device() const { return device_; }
  uint64_t inode() const { return inode_; }

 private:
  DirFd(UniqueFd fd, std::string path, const struct stat& st);
  absl::Status RemoveTreeAt(absl::string_view name, int depth) const;
  std::string PathOf(absl::string_view name) const;

  UniqueFd fd_;
  std::string path_;
  uint64_t device_ = 0;
  uint64_t inode_ = 0;
};

// INVALID_ARGUMENT unless `name` is a single path component (not empty, ".", ".." and no '/').
absl::Status ValidatePathComponent(absl::string_view name);

}  // namespace dt
