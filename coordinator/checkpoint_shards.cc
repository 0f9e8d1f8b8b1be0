#include "coordinator/checkpoint_shards.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/limits.h"
#include "common/names.h"
#include "coordinator/checkpoint_publisher.h"

namespace dt {
namespace {

// The deepest nesting of arrays and objects in `text` (strings skipped), without recursion.
int NestingDepth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseLayout(const std::string& who, const std::string& layout_json) {
  if (layout_json.size() > kMaxCheckpointLayoutBytes) {
    return absl::InvalidArgumentError(absl::StrCat(who, "'s checkpoint layout is ", layout_json.size(),
                                                   " bytes; the limit is ", kMaxCheckpointLayoutBytes));
  }
  if (NestingDepth(layout_json) > kMaxCheckpointLayoutDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "'s checkpoint layout nests deeper than ", kMaxCheckpointLayoutDepth, " levels"));
  }
  nlohmann::json doc = nlohmann::json::parse(layout_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(who, "'s checkpoint layout is not a JSON document"));
  }
  return doc;
}

absl::Status ShardCollector::Accept(int rank, const v1::Manifest& manifest, const std::string& layout_json) {
  if (absl::Status s = ValidateManifest(manifest, kMaxCheckpointFiles, /*allow_empty=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ", s.message()));
  }
  std::string layout, digest;
  if (!layout_json.empty()) {
    absl::StatusOr<nlohmann::json> parsed = ParseLayout(absl::StrCat("rank ", rank), layout_json);
    if (!parsed.ok()) return parsed.status();
    // Compared as documents: ranks in other languages space and order a document differently,
    // and the canonical text (keys sorted, no spaces) is the same for the same document.
    layout = parsed->dump();
    digest = Sha256Hex(layout);
    for (const auto& [other, other_digest] : layout_digests_) {
      if (other != rank && other_digest != digest) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", rank, "'s checkpoint layout differs from rank ", other,
                                                       "'s: the ranks must describe one layout"));
      }
    }
  }
  auto earlier = shards_.find(rank);
  size_t earlier_files = earlier == shards_.end() ? 0 : earlier->second.files_size();
  for (const auto& f : manifest.files()) {
    auto owner = owners_.find(f.name());
    if (owner != owners_.end() && owner->second != rank) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", Quote(f.name()), " is claimed by rank ",
                                                     owner->second, " and by rank ", rank,
                                                     ": each file of a sharded checkpoint has one writer"));
    }
  }
  if (files_ - earlier_files + manifest.files_size() > kMaxShardedCheckpointFiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("the sharded checkpoint's ranks list more than ", kMaxShardedCheckpointFiles, " files in all"));
  }
  if (earlier != shards_.end()) {
    for (const auto& f : earlier->second.files()) owners_.erase(f.name());
  }
  for (const auto& f : manifest.files()) owners_[f.name()] = rank;
  files_ = files_ - earlier_files + manifest.files_size();
  shards_[rank] = manifest;
  if (digest.empty()) {
    layout_digests_.erase(rank);  // a retry without one withdraws the rank's layout
    if (layout_digests_.empty()) layout_.clear();
  } else {
    layout_digests_[rank] = digest;
    layout_ = std::move(layout);  // every other rank that sent one described the same
  }
  return absl::OkStatus();
}

v1::Manifest ShardCollector::Combined(std::vector<int>& file_ranks) const {
  v1::Manifest out;
  file_ranks.clear();
  for (const auto& [rank, manifest] : shards_) {
    for (const auto& f : manifest.files()) {
      *out.add_files() = f;
      file_ranks.push_back(rank);
    }
  }
  return out;
}

}  // namespace dt
