#include "client/checkpoint_manifest.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/dir_fd.h"
#include "common/fs.h"

namespace dt {

absl::StatusOr<v1::Manifest> ManifestOfDirectory(const std::string& dir) {
  absl::StatusOr<DirFd> d = DirFd::Open(dir);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::vector<DirFd::Entry>> entries = d->List();
  if (!entries.ok()) return entries.status();
  std::sort(entries->begin(), entries->end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  v1::Manifest manifest;
  for (const DirFd::Entry& e : *entries) {
    std::string path = JoinPath(dir, e.name);
    if (e.type != S_IFREG) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is not a plain file: a checkpoint directory holds plain files only (no subdirectories or links)"));
    }
    absl::StatusOr<UniqueFd> fd = d->OpenRegularFile(e.name);
    if (!fd.ok()) return fd.status();
    struct stat st;
    if (::fstat(fd->get(), &st) != 0) return absl::InternalError(absl::StrCat("fstat ", path));
    absl::StatusOr<std::string> digest = Sha256Fd(fd->get(), path);
    if (!digest.ok()) return digest.status();
    v1::ManifestFile* f = manifest.add_files();
    f->set_name(e.name);
    f->set_size(st.st_size);
    f->set_sha256(*digest);
  }
  if (manifest.files_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint writer saved nothing into ", dir));
  }
  return manifest;
}

}  // namespace dt
