// The manifests of a sharded checkpoint round, one per rank, gathered until every rank committed:
// each file name belongs to one rank, the ranks' layout documents agree, and the whole stays
// within the limits of one published manifest.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dt/v1/checkpoint.pb.h"

namespace dt {

// A checkpoint layout document: JSON, at most kMaxCheckpointLayoutBytes, nested at most
// kMaxCheckpointLayoutDepth deep (it is written into manifest.json, and readers recurse).
// INVALID_ARGUMENT naming `who` ("rank 3") otherwise. Returns the parsed document.
absl::StatusOr<nlohmann::json> ParseLayout(const std::string& who, const std::string& layout_json);

class ShardCollector {
 public:
  // Takes `rank`'s manifest (replacing what an earlier call of the same rank sent: a retry) and
  // its layout document (empty: none). INVALID_ARGUMENT, naming the cause, for a malformed
  // manifest, a file name another rank claimed (naming both ranks), more files in all than
  // kMaxShardedCheckpointFiles, a layout that is not JSON or is over kMaxCheckpointLayoutBytes, or
  // a layout unlike the one another rank sent. On error nothing of the call is kept.
  absl::Status Accept(int rank, const v1::Manifest& manifest, const std::string& layout_json);

  // Ranks whose manifest is in.
  size_t ranks() const { return shards_.size(); }
  bool has(int rank) const { return shards_.count(rank) > 0; }

  // Every rank's files in one manifest, by rank, with each file's rank at the same index.
  v1::Manifest Combined(std::vector<int>& file_ranks) const;
  // The layout document ("" when no rank sent one), as every rank that sent one described it.
  const std::string& layout_json() const { return layout_; }

 private:
  std::map<int, v1::Manifest> shards_;
  std::map<std::string, int> owners_;  // file name → rank
  size_t files_ = 0;
  // Each rank's layout as the SHA-256 of its canonical text: a retry is compared with the other
  // ranks' too, so no rank's retry can publish a document another rank did not describe.
  std::map<int, std::string> layout_digests_;
  std::string layout_;  // the canonical text the ranks in layout_digests_ sent ("" when none)
};

}  // namespace dt
