#include "coordinator/checkpoint_publisher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
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

// manifest.json of up to kMaxShardedCheckpointFiles entries (and a layout), written compact,
// stays well below this.
constexpr size_t kMaxManifestBytes = 64 << 20;

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateManifest(const v1::Manifest& manifest, size_t max_files, bool allow_empty) {
  if (manifest.files().empty() && !allow_empty) {
    return absl::InvalidArgumentError("checkpoint manifest lists no files");
  }
  if (static_cast<size_t>(manifest.files_size()) > max_files) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint manifest lists ", manifest.files_size(), " files; the limit is ", max_files));
  }
  std::set<std::string> seen;
  for (const auto& f : manifest.files()) {
    if (absl::Status s = ValidateLabel("checkpoint file name", f.name()); !s.ok()) return s;
    // A leading '.' is allowed: torch.distributed.checkpoint writes ".metadata".
    if (absl::StrContains(f.name(), '/') || f.name() == "." || f.name() == ".." || f.name() == kManifestFile) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file name ", Quote(f.name()),
                                                     " must be a plain file name (no '/', not . or .., not "
                                                     "manifest.json)"));
    }
    if (!seen.insert(f.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest lists ", Quote(f.name()), " twice"));
    }
    if (f.size() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", Quote(f.name()), " has negative size"));
    }
    if (!IsHex64(f.sha256())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint file ", Quote(f.name()), ": sha256 must be 64 lower-case hex digits"));
    }
  }
  return absl::OkStatus();
}

namespace {

// One manifest file, opened without following a link and checked to be a regular file of the
// manifest's size. The size and type come from the open descriptor, so what is checked is what
// is hashed.
absl::StatusOr<UniqueFd> OpenListedFile(const DirFd& partial, const v1::ManifestFile& f) {
  std::string path = JoinPath(partial.path(), f.name());
  absl::StatusOr<UniqueFd> fd = partial.OpenRegularFile(f.name());
  if (!fd.ok()) {
    if (absl::IsNotFound(fd.status())) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " listed in the manifest is missing"));
    }
    return absl::DataLossError(fd.status().message());
  }
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return absl::DataLossError(absl::StrCat("cannot stat ", path));
  if (st.st_size != f.size()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is ", st.st_size, " bytes on disk but ",
                                            f.size(), " in the manifest"));
  }
  return fd;
}

// Hashes the manifest's files on up to one thread per core (the commit waits for this, and so
// does every rank of the run).
absl::Status VerifyDigests(const DirFd& partial, const v1::Manifest& manifest) {
  const int n = manifest.files_size();
  std::vector<absl::Status> results(n);
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < n; i = next++) {
      const v1::ManifestFile& f = manifest.files(i);
      std::string path = JoinPath(partial.path(), f.name());
      absl::StatusOr<UniqueFd> fd = OpenListedFile(partial, f);
      if (!fd.ok()) {
        results[i] = fd.status();
        continue;
      }
      absl::StatusOr<std::string> digest = Sha256Fd(fd->get(), path);
      if (!digest.ok()) {
        results[i] = absl::DataLossError(digest.status().message());
      } else if (*digest != f.sha256()) {
        results[i] = absl::DataLossError(
            absl::StrCat("checkpoint file ", path, " has SHA-256 ", *digest, " but the manifest says ", f.sha256()));
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

// The partial directory must hold the manifest's files and nothing else.
absl::Status CheckListing(const DirFd& partial, const v1::Manifest& manifest, bool sharded) {
  std::set<std::string> expected;
  for (const auto& f : manifest.files()) expected.insert(f.name());
  absl::StatusOr<std::vector<DirFd::Entry>> entries = partial.List();
  if (!entries.ok()) return absl::DataLossError(entries.status().message());
  for (const DirFd::Entry& e : *entries) {
    if (!expected.count(e.name)) {
      return absl::DataLossError(absl::StrCat("checkpoint directory ", partial.path(), " holds ", Quote(e.name),
                                              sharded ? ", which no rank's manifest lists (in a sharded round each "
                                                        "rank lists the files it wrote)"
                                                      : ", which the manifest does not list"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::CheckpointInfo> VerifyAndPublish(const DirFd& checkpoints, const std::string& partial_name,
                                                    int64_t step, const v1::Manifest& manifest,
                                                    const RoundWriters& writers, CheckpointVerification verification) {
  if (writers.sharded && manifest.files().empty()) {
    return absl::InvalidArgumentError("no rank of the sharded round listed a file: a checkpoint holds at least one");
  }
  if (absl::Status s = ValidateManifest(manifest, writers.sharded ? kMaxShardedCheckpointFiles : kMaxCheckpointFiles);
      !s.ok()) {
    return s;
  }
  if (writers.sharded && writers.file_ranks.size() != static_cast<size_t>(manifest.files_size())) {
    return absl::InternalError("a sharded round's files and their ranks differ in number");
  }
  absl::StatusOr<DirFd> partial = checkpoints.Sub(partial_name);
  if (!partial.ok()) {
    return absl::DataLossError(absl::StrCat("the round's directory is gone or replaced: ", partial.status().message()));
  }
  if (absl::Status s = CheckListing(*partial, manifest, writers.sharded); !s.ok()) return s;
  int64_t total = 0;
  nlohmann::json files = nlohmann::json::array();
  // Every file's presence, type and size first (cheap), so a bad round fails before gigabytes are
  // hashed; VerifyDigests, when asked for, opens each again and hashes what it opened.
  for (int i = 0; i < manifest.files_size(); ++i) {
    const v1::ManifestFile& f = manifest.files(i);
    if (absl::StatusOr<UniqueFd> fd = OpenListedFile(*partial, f); !fd.ok()) return fd.status();
    total += f.size();
    int rank = writers.sharded ? writers.file_ranks[i] : writers.writer_rank;
    files.push_back({{"name", f.name()}, {"size", f.size()}, {"sha256", f.sha256()}, {"rank", rank}});
  }
  if (verification == CheckpointVerification::kDigests) {
    if (absl::Status s = VerifyDigests(*partial, manifest); !s.ok()) return s;
  }
  double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  nlohmann::json doc = {{"step", step},
                        {"files", files},
                        {"bytes", total},
                        {"committed_at", now},
                        {"sharded", writers.sharded},
                        {"world_size", writers.world_size}};
  if (!writers.layout_json.empty()) doc["layout"] = nlohmann::json::parse(writers.layout_json, nullptr, false);
  // Indented for the people who read it, unless that passes what readers take (FindLatest): a
  // layout nested 64 deep grows about 60-fold when indented. Compact, the limits above keep it
  // well within.
  std::string text = doc.dump(2);
  if (text.size() + 1 > kMaxManifestBytes) text = doc.dump();
  if (text.size() + 1 > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint's manifest.json would be ", text.size(),
                                                   " bytes; readers take at most ", kMaxManifestBytes,
                                                   ": list fewer files or send a smaller layout"));
  }
  if (absl::Status s = partial->WriteFileAtomic(kManifestFile, text + "\n"); !s.ok()) return s;
  // A directory (or anything else) of the same step from an earlier attempt is moved aside,
  // then removed.
  std::string final_name = CheckpointDirName(step);
  if (checkpoints.Lstat(final_name).ok()) {
    std::string trash = absl::StrCat(final_name, ".old-", RandomHex(4), ".partial-old");
    if (absl::Status s = checkpoints.Rename(final_name, trash); !s.ok()) return s;
    if (absl::Status s = checkpoints.RemoveTree(trash); !s.ok()) DT_LOG(Warning) << s.message();
  }
  if (absl::Status s = checkpoints.Rename(partial_name, final_name); !s.ok()) return s;
  if (absl::Status s = checkpoints.Fsync(); !s.ok()) return s;
  if (absl::Status s = checkpoints.ReplaceSymlink(final_name, kLatestLink); !s.ok()) return s;
  v1::CheckpointInfo info;
  info.set_step(step);
  info.set_path(JoinPath(checkpoints.path(), final_name));
  info.set_bytes(total);
  info.set_committed(true);
  info.set_sharded(writers.sharded);
  info.set_world_size(writers.world_size);
  info.set_writer_rank(writers.sharded ? -1 : writers.writer_rank);
  info.mutable_committed_at()->set_seconds(static_cast<int64_t>(now));
  info.mutable_committed_at()->set_nanos(static_cast<int32_t>((now - static_cast<int64_t>(now)) * 1e9));
  return info;
}

void SetShards(v1::CheckpointInfo& info, const std::vector<std::pair<int, int64_t>>& file_ranks_and_bytes) {
  std::map<int, v1::CheckpointShard> by_rank;
  for (const auto& [rank, bytes] : file_ranks_and_bytes) {
    v1::CheckpointShard& shard = by_rank[rank];
    shard.set_rank(rank);
    shard.set_files(shard.files() + 1);
    shard.set_bytes(shard.bytes() + bytes);
  }
  info.clear_shards();
  for (auto& [rank, shard] : by_rank) *info.add_shards() = std::move(shard);
}

absl::Status ApplyRetention(const DirFd& checkpoints, const std::vector<int64_t>& keep) {
  if (keep.empty()) return absl::OkStatus();
  std::set<int64_t> kept(keep.begin(), keep.end());
  int64_t newest = *kept.rbegin();
  absl::StatusOr<std::vector<DirFd::Entry>> entries = checkpoints.List();
  if (!entries.ok()) return entries.status();
  for (const DirFd::Entry& e : *entries) {
    std::optional<int64_t> step = ParseStepDir(e.name);
    // A step newer than every kept one is not this pass's to judge: it is the work of a later run
    // on the same directory (the pass runs after its ranks heard of the commit, and their run may
    // have ended and the experiment started again meanwhile).
    if (!step || kept.count(*step) || *step > newest || e.type != S_IFDIR) continue;
    if (absl::Status s = checkpoints.RemoveTree(e.name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RemovePartials(const DirFd& checkpoints) {
  absl::StatusOr<std::vector<DirFd::Entry>> entries = checkpoints.List();
  if (!entries.ok()) return entries.status();
  int removed = 0;
  absl::Status first_error;
  for (const DirFd::Entry& e : *entries) {
    if (!absl::StrContains(e.name, ".partial-")) continue;
    if (absl::Status s = checkpoints.RemoveTree(e.name); !s.ok()) {
      first_error.Update(s);
      continue;
    }
    ++removed;
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

absl::Status RemoveAbortedPartial(const DirFd& checkpoints, const std::string& partial_name) {
  if (!checkpoints.Lstat(partial_name).ok()) return absl::OkStatus();
  std::string aside = absl::StrCat(partial_name, ".aborted-", RandomHex(4));
  if (absl::Status s = checkpoints.Rename(partial_name, aside); !s.ok()) {
    return absl::IsNotFound(s) ? absl::OkStatus() : s;
  }
  // A create already past its path lookup when the name changed can still land once: try again.
  absl::Status removed;
  for (int attempt = 0; attempt < 3; ++attempt) {
    removed = checkpoints.RemoveTree(aside);
    if (removed.ok()) break;
  }
  return removed;
}

std::optional<v1::CheckpointInfo> FindLatest(const DirFd& checkpoints) {
  absl::StatusOr<std::string> name = checkpoints.ReadLink(kLatestLink);
  if (!name.ok()) return std::nullopt;
  std::optional<int64_t> step = ParseStepDir(*name);
  if (!step) return std::nullopt;
  absl::StatusOr<DirFd> dir = checkpoints.Sub(*name);
  if (!dir.ok()) {
    DT_LOG(Warning) << "not resuming from what latest names: " << dir.status().message();
    return std::nullopt;
  }
  absl::StatusOr<std::string> text = dir->ReadFile(kManifestFile, kMaxManifestBytes);
  if (!text.ok()) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("files") || !doc["files"].is_array()) return std::nullopt;
  int64_t total = 0;
  std::vector<std::pair<int, int64_t>> shard_files;  // (rank, bytes) of each file, sharded checkpoints
  bool sharded = doc.contains("sharded") && doc["sharded"].is_boolean() && doc["sharded"].get<bool>();
  for (const auto& f : doc["files"]) {
    if (!f.contains("name") || !f.contains("size") || !f["name"].is_string() || !f["size"].is_number_integer()) {
      return std::nullopt;
    }
    if (sharded) {
      if (!f.contains("rank") || !f["rank"].is_number_integer()) return std::nullopt;
      shard_files.emplace_back(f["rank"].get<int>(), f["size"].get<int64_t>());
    }
    std::string file = f["name"].get<std::string>();
    absl::StatusOr<struct stat> st = dir->Lstat(file);  // INVALID_ARGUMENT for a name with '/
    if (!st.ok() || !S_ISREG(st->st_mode) || st->st_size != f["size"].get<int64_t>()) {
      DT_LOG(Warning) << "checkpoint " << dir->path() << " named by latest does not match its manifest (" << Quote(file)
                      << "); not resuming from it";
      return std::nullopt;
    }
    total += st->st_size;
  }
  v1::CheckpointInfo info;
  info.set_step(*step);
  info.set_path(dir->path());
  info.set_bytes(total);
  info.set_committed(true);
  if (doc.contains("committed_at") && doc["committed_at"].is_number()) {
    info.mutable_committed_at()->set_seconds(static_cast<int64_t>(doc["committed_at"].get<double>()));
  }
  if (doc.contains("world_size") && doc["world_size"].is_number_integer()) {
    info.set_world_size(doc["world_size"].get<int32_t>());
  }
  if (sharded) {
    info.set_sharded(true);
    info.set_writer_rank(-1);
    SetShards(info, shard_files);
  }
  return info;
}

}  // namespace dt
