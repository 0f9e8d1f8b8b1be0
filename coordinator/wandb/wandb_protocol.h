// The W&B wire protocol as the official SDK speaks it (docs/wandb-protocol.md):
// the RunResumeStatus query, the UpsertBucket mutation, and file_stream bodies with line offsets.
// Pure functions: bodies in, bodies out.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dt::wandb {

// What the W&B run is and how it is shown.
struct RunMeta {
  std::string entity;  // may be empty: W&B's default entity of the key
  std::string project;
  std::string run_id;  // [a-z0-9_-]
  std::string display_name;
  std::string group;
  std::string job_type = "train";
  std::vector<std::string> tags;
  std::string config_json;  // {"key": {"value": ...}, ..., "_wandb": {"value": {"t": {}}}}
  std::string host;
  std::string program = "dttrainer";
};

struct ResumeState {
  bool exists = false;
  int64_t history_lines = 0;
  int64_t last_step = -1;  // -1: no history
  double runtime = 0;      // seconds, from the tail
};

std::string ResumeStatusBody(const RunMeta& meta);
// INVALID_ARGUMENT when the reply is not the expected shape.
absl::StatusOr<ResumeState> ParseResumeStatus(const std::string& body);

std::string UpsertBucketBody(const RunMeta& meta, const std::string& summary_json);
struct UpsertResult {
  std::string entity;
  std::string project;
};
absl::StatusOr<UpsertResult> ParseUpsertBucket(const std::string& body);

std::string FileStreamUrl(const std::string& base_url, const std::string& entity, const std::string& project,
                          const std::string& run_id);
// History lines from `offset`, the whole summary (if given), and the final flag (if given).
std::string FileStreamBody(int64_t offset, const std::vector<std::string>& history,
                           const std::optional<std::string>& summary_json, std::optional<int> exitcode);
// {"complete": false, "failed": false}: keeps an idle run alive.
std::string HeartbeatBody();

}  // namespace dt::wandb
