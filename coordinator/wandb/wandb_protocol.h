// The W&B wire protocol as the official SDK speaks it (docs/wandb-protocol.md):
// the RunResumeStatus query, the UpsertBucket mutation, and file_stream bodies with line offsets.
// Pure functions: bodies in, bodies out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

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
// A metric's value, the metric named by its index in a names table the caller keeps.
struct NamedValue {
  uint32_t name = 0;
  double value = 0;
};

// The history lines of one file_stream post, each written once, straight into the text of the
// body's "content" array: a line is a JSON object of a row's values with _step, _timestamp and
// _runtime, held in the body as a JSON string. The names are escaped once per post, not once per
// value, and no JSON object is built per line. (Building one per line, then escaping every line
// again into the body, was a third of dtcoord's CPU at 800k points/s.) Numbers are written as
// nlohmann's dump() writes them; a value that is not finite is null, as dump() writes it.
class HistoryContent {
 public:
  // `names[i]` is what NamedValue::name == i names. A metric named _step, _timestamp or _runtime
  // is left out of the lines: W&B's own fields take those keys.
  explicit HistoryContent(const std::vector<std::string>& names);

  // Room for `bytes` of lines, so that the text is not copied as it grows.
  void Reserve(size_t bytes) { text_.reserve(bytes); }
  // One line. Each name at most once in `values`.
  void AddLine(int64_t step, double timestamp, double runtime, absl::Span<const NamedValue> values);
  int64_t lines() const { return lines_; }
  // The lines, comma-separated, each a JSON string: the inside of the "content" array.
  const std::string& text() const { return text_; }

 private:
  void AppendNumber(double v);

  std::vector<std::string> keys_;  // per name: `\"name\":` as it stands inside a line's string; empty: left out
  std::string text_;
  int64_t lines_ = 0;
};

// History lines from `offset` (none: `history` may be empty), the whole summary (if given), and the
// final flag (if given).
std::string FileStreamBody(int64_t offset, const HistoryContent& history,
                           const std::optional<std::string>& summary_json, std::optional<int> exitcode);
// {"complete": false, "failed": false}: keeps an idle run alive.
std::string HeartbeatBody();

}  // namespace dt::wandb
