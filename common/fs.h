// File-system helpers with the durability the coordinator's invariants need: data is fsynced
// before it is renamed into place, and the directory is fsynced after the rename.
#pragma once

#include <sys/types.h>

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dt {

// "cannot <what> <path>: <strerror>" with the code the errno calls for: NOT_FOUND (ENOENT),
// RESOURCE_EXHAUSTED (ENOSPC, EDQUOT), FAILED_PRECONDITION (EACCES, EPERM, EROFS), else INTERNAL.
absl::Status ErrnoStatus(absl::string_view what, const std::string& path, int err);

absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old file or the new one, never a torn one.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents, mode_t mode = 0644);

absl::Status FsyncDir(const std::string& dir);

// write() until all of `data` is written (EINTR retried); 0, or the errno that stopped it.
int WriteFully(int fd, const void* data, size_t size);

// The path with every link, "." and ".." resolved (realpath); NOT_FOUND and the like naming it.
absl::StatusOr<std::string> RealPath(const std::string& path);

// mkdir -p; FAILED_PRECONDITION naming the path and errno text when it cannot.
absl::Status MakeDirs(const std::string& path);

// rm -rf; OK when the path does not exist.
absl::Status RemoveAll(const std::string& path);

// Whether the process may create files in `dir` (access(W_OK|X_OK)).
bool IsWritableDir(const std::string& dir);

// The directory part of a path ("/a/b" → "/a").
std::string Dirname(const std::string& path);

// Joins two path parts with exactly one '/'.
std::string JoinPath(absl::string_view a, absl::string_view b);

// The last component of `path` ("train.py" of "/x/train.py"; the whole of a name without '/').
std::string Basename(absl::string_view path);

}  // namespace dt
