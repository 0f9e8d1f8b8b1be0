#include "coordinator/checkpoint_publisher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"

namespace dt {
namespace fs = std::filesystem;

std::string CheckpointDirName(int64_t step) { return absl::StrCat("step-", step); }

std::string PartialDirName(int64_t step, const std::string& nonce) {
  return absl::StrCat("step-", step, ".partial-", nonce);
}

namespace {

// step-<N> (exactly) → N.
std::optional<int64_t> ParseStepDir(const std::string& name) {
  if (!absl::StartsWith(name, "step-")) return std::nullopt;
  int64_t step = 0;
  if (!absl::SimpleAtoi(name.substr(5), &step) || step <= 0) return std::nullopt;
  if (CheckpointDirName(step) != name) return std::nullopt;
  return step;
}

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateManifest(const v1::Manifest& manifest) {
  if (manifest.files().empty()) return absl::InvalidArgumentError("checkpoint manifest lists no files");
  if (static_cast<size_t>(manifest.files_size()) > kMaxCheckpointFiles) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest lists ", manifest.files_size(),
                                                   " files; the limit is ", kMaxCheckpointFiles));
  }
  std::set<std::string> seen;
  for (const auto& f : manifest.files()) {
    if (absl::Status s = ValidateLabel("checkpoint file name", f.name()); !s.ok()) return s;
    if (absl::StrContains(f.name(), '/') || f.name() == "." || f.name() == ".." ||
        f.name() == kManifestFile || absl::StartsWith(f.name(), ".")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file name ", Quote(f.name()),
          " must be a plain file name (no '/', no leading '.', not manifest.json)"));
    }
    if (!seen.insert(f.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest lists ", Quote(f.name()), " twice"));
    }
    if (f.size() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", Quote(f.name()), " has negative size"));
    }
    if (!IsHex64(f.sha256())) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", Quote(f.name()),
                                                     ": sha256 must be 64 lower-case hex digits"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Hashes the manifest's files on up to one thread per core (the commit waits for this, and so
// does every rank of the run).
absl::Status VerifyDigests(const std::string& partial_dir, const v1::Manifest& manifest) {
  const int n = manifest.files_size();
  std::vector<absl::Status> results(n);
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < n; i = next++) {
      const v1::ManifestFile& f = manifest.files(i);
      std::string path = JoinPath(partial_dir, f.name());
      absl::StatusOr<std::string> digest = Sha256File(path);
      if (!digest.ok()) {
        results[i] = absl::DataLossError(digest.status().message());
      } else if (*digest != f.sha256()) {
        results[i] = absl::DataLossError(absl::StrCat("checkpoint file ", path, " has SHA-256 ", *digest,
                                                      " but the manifest says ", f.sha256()));
      }
    }
  };
  int threads = std::min<int>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& t : helpers) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::CheckpointInfo> VerifyAndPublish(const std::string& checkpoints_dir,
                                                    const std::string& partial_dir,
                                                    const std::string& final_dir, int64_t step,
                                                    const v1::Manifest& manifest) {
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) return s;
  std::error_code ec;
  std::set<std::string> expected;
  for (const auto& f : manifest.files()) expected.insert(f.name());
  for (const auto& entry : fs::directory_iterator(partial_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!expected.count(name)) {
      return absl::DataLossError(absl::StrCat("checkpoint directory ", partial_dir, " holds ",
                                              Quote(name), ", which the manifest does not list"));
    }
  }
  if (ec) {
    return absl::DataLossError(absl::StrCat("cannot list ", partial_dir, ": ", ec.message()));
  }
  int64_t total = 0;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : manifest.files()) {
    std::string path = JoinPath(partial_dir, f.name());
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " listed in the manifest is missing"));
    }
    if (st.st_size != f.size()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is ", st.st_size,
                                              " bytes on disk but ", f.size(), " in the manifest"));
    }
    total += f.size();
    files.push_back({{"name", f.name()}, {"size", f.size()}, {"sha256", f.sha256()}});
  }
  if (absl::Status s = VerifyDigests(partial_dir, manifest); !s.ok()) return s;
  double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  nlohmann::json doc = {{"step", step}, {"files", files}, {"bytes", total}, {"committed_at", now}};
  if (absl::Status s = WriteFileAtomic(JoinPath(partial_dir, kManifestFile), doc.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  // A directory of the same step from an earlier attempt is moved aside, then removed.
  if (fs::exists(final_dir, ec)) {
    std::string trash = absl::StrCat(final_dir, ".old-", RandomHex(4), ".partial-old");
    if (::rename(final_dir.c_str(), trash.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot move aside ", final_dir, ": ", std::strerror(errno)));
    }
    if (absl::Status s = RemoveAll(trash); !s.ok()) DT_LOG(Warning) << s.message();
  }
  if (::rename(partial_dir.c_str(), final_dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", partial_dir, " to ", final_dir, ": ",
                                            std::strerror(errno)));
  }
  if (absl::Status s = FsyncDir(checkpoints_dir); !s.ok()) return s;
  std::string link = JoinPath(checkpoints_dir, kLatestLink);
  if (absl::Status s = ReplaceSymlink(CheckpointDirName(step), link); !s.ok()) return s;
  v1::CheckpointInfo info;
  info.set_step(step);
  info.set_path(final_dir);
  info.set_bytes(total);
  info.set_committed(true);
  info.mutable_committed_at()->set_seconds(static_cast<int64_t>(now));
  info.mutable_committed_at()->set_nanos(static_cast<int32_t>((now - static_cast<int64_t>(now)) * 1e9));
  return info;
}

absl::Status ApplyRetention(const std::string& checkpoints_dir, const std::vector<int64_t>& keep) {
  std::set<int64_t> kept(keep.begin(), keep.end());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    std::optional<int64_t> step = ParseStepDir(entry.path().filename().string());
    if (!step || kept.count(*step) || !entry.is_directory()) continue;
    if (absl::Status s = RemoveAll(entry.path().string()); !s.ok()) return s;
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", checkpoints_dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<int> RemovePartials(const std::string& checkpoints_dir) {
  int removed = 0;
  std::error_code ec;
  std::vector<std::string> doomed;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (absl::StrContains(name, ".partial-")) doomed.push_back(entry.path().string());
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::InternalError(absl::StrCat("cannot list ", checkpoints_dir, ": ", ec.message()));
  }
  for (const auto& path : doomed) {
    if (absl::Status s = RemoveAll(path); !s.ok()) return s;
    ++removed;
  }
  return removed;
}

std::optional<v1::CheckpointInfo> FindLatest(const std::string& checkpoints_dir) {
  std::string link = JoinPath(checkpoints_dir, kLatestLink);
  char target[4096];
  ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return std::nullopt;
  std::string name(target, static_cast<size_t>(n));
  std::optional<int64_t> step = ParseStepDir(name);
  if (!step) return std::nullopt;
  std::string dir = JoinPath(checkpoints_dir, name);
  absl::StatusOr<std::string> text = ReadFile(JoinPath(dir, kManifestFile));
  if (!text.ok()) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("files") || !doc["files"].is_array()) return std::nullopt;
  int64_t total = 0;
  for (const auto& f : doc["files"]) {
    if (!f.contains("name") || !f.contains("size") || !f["name"].is_string()) return std::nullopt;
    struct stat st;
    std::string path = JoinPath(dir, f["name"].get<std::string>());
    if (::stat(path.c_str(), &st) != 0 || st.st_size != f["size"].get<int64_t>()) {
      DT_LOG(Warning) << "checkpoint " << dir << " named by latest does not match its manifest ("
                      << path << "); not resuming from it";
      return std::nullopt;
    }
    total += st.st_size;
  }
  v1::CheckpointInfo info;
  info.set_step(*step);
  info.set_path(dir);
  info.set_bytes(total);
  info.set_committed(true);
  if (doc.contains("committed_at") && doc["committed_at"].is_number()) {
    info.mutable_committed_at()->set_seconds(static_cast<int64_t>(doc["committed_at"].get<double>()));
  }
  return info;
}

}  // namespace dt
