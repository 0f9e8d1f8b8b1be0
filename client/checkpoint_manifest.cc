#include "client/checkpoint_manifest.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/dir_fd.h"
#include "common/fs.h"
#include "common/names.h"

#include <nlohmann/json.hpp>

namespace dt {

namespace {

// Appends `name` of `d` with its size and SHA-256 (read through one descriptor, so what is sized
// is what is hashed). FAILED_PRECONDITION for anything but a regular file.
absl::Status AddFile(const DirFd& d, const std::string& name, v1::Manifest& manifest) {
  std::string path = JoinPath(d.path(), name);
  absl::StatusOr<UniqueFd> fd = d.OpenRegularFile(name);
  if (!fd.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not a plain file that exists: a checkpoint holds plain files only (", fd.status().message(), ")"));
  }
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return absl::InternalError(absl::StrCat("fstat ", path));
  absl::StatusOr<std::string> digest = Sha256Fd(fd->get(), path);
  if (!digest.ok()) return digest.status();
  v1::ManifestFile* f = manifest.add_files();
  f->set_name(name);
  f->set_size(st.st_size);
  f->set_sha256(*digest);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Manifest> ManifestOfDirectory(const std::string& dir) {
  absl::StatusOr<DirFd> d = DirFd::Open(dir);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::vector<DirFd::Entry>> entries = d->List();
  if (!entries.ok()) return entries.status();
  std::sort(entries->begin(), entries->end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  v1::Manifest manifest;
  for (const DirFd::Entry& e : *entries) {
    if (e.type != S_IFREG) {
      return absl::FailedPreconditionError(absl::StrCat(JoinPath(dir, e.name),
                                                        " is not a plain file: a checkpoint directory holds plain "
                                                        "files only (no subdirectories or links)"));
    }
    if (absl::Status s = AddFile(*d, e.name, manifest); !s.ok()) return s;
  }
  if (manifest.files_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint writer saved nothing into ", dir));
  }
  return manifest;
}

absl::StatusOr<v1::Manifest> ManifestOfFiles(const std::string& dir, std::vector<std::string> names) {
  absl::StatusOr<DirFd> d = DirFd::Open(dir);
  if (!d.ok()) return d.status();
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  v1::Manifest manifest;
  for (const std::string& name : names) {
    if (name.empty() || name == "." || name == ".." || name == "manifest.json" || name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file name ", Quote(name),
                                                     " must be a plain file name inside ", dir,
                                                     " (not manifest.json, which the coordinator writes)"));
    }
    if (absl::Status s = AddFile(*d, name, manifest); !s.ok()) return s;
  }
  return manifest;
}

absl::StatusOr<CheckpointFiles> CheckpointFiles::Open(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(JoinPath(dir, "manifest.json"));
  if (!text.ok()) return absl::DataLossError(absl::StrCat("checkpoint ", dir, " has no readable manifest.json"));
  nlohmann::json m = nlohmann::json::parse(*text, nullptr, false);
  if (m.is_discarded() || !m.contains("files") || !m["files"].is_array()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": manifest.json is malformed"));
  }
  CheckpointFiles out;
  out.dir_ = dir;
  for (const auto& f : m["files"]) {
    if (!f.is_object()) return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": manifest.json is malformed"));
    File file{f.value("name", ""), f.value("size", int64_t{-1}), f.value("sha256", "")};
    if (absl::Status s = ValidatePathComponent(file.name); !s.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": manifest.json lists a bad file name"));
    }
    std::string path = JoinPath(dir, file.name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is missing"));
    if (st.st_size != file.size) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is ", st.st_size, " bytes on disk but ",
                                              file.size, " in its manifest; the checkpoint is corrupt"));
    }
    out.total_bytes_ += file.size;
    out.files_.push_back(std::move(file));
  }
  return out;
}

absl::Status CheckpointFiles::Verify(const std::string& name) const {
  auto it = std::find_if(files_.begin(), files_.end(), [&](const File& f) { return f.name == name; });
  std::string path = JoinPath(dir_, name);
  if (it == files_.end()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", path, " is not listed in its manifest.json; the checkpoint is corrupt"));
  }
  absl::StatusOr<std::string> digest = Sha256File(path);
  if (!digest.ok()) return absl::DataLossError(digest.status().message());
  if (*digest != it->sha256) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " does not match its manifest (SHA-256 ", *digest,
                                            ", written as ", it->sha256, "); the checkpoint is corrupt"));
  }
  return absl::OkStatus();
}

std::vector<std::string> CheckpointFiles::names() const {
  std::vector<std::string> out;
  for (const File& f : files_) out.push_back(f.name);
  return out;
}

absl::StatusOr<int64_t> VerifyCheckpointDirectory(const std::string& dir) {
  absl::StatusOr<CheckpointFiles> files = CheckpointFiles::Open(dir);
  if (!files.ok()) return files.status();
  for (const std::string& name : files->names()) {
    if (absl::Status s = files->Verify(name); !s.ok()) return s;
  }
  return files->total_bytes();
}

}  // namespace dt
