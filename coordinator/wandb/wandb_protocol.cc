#include "coordinator/wandb/wandb_protocol.h"

#include <array>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dt::wandb {

namespace {
constexpr char kResumeQuery[] =
    "query RunResumeStatus($project: String, $entity: String, $name: String!) {\n"
    "  model(name: $project, entityName: $entity) {\n"
    "    id\n    name\n    entity { id name }\n"
    "    bucket(name: $name, missingOk: true) {\n"
    "      id name summaryMetrics displayName logLineCount historyLineCount eventsLineCount\n"
    "      historyTail eventsTail config tags wandbConfig(keys: [\"t\"])\n"
    "    }\n  }\n}\n";

constexpr char kUpsertMutation[] =
    "mutation UpsertBucket($id: String, $name: String, $project: String, $entity: String, "
    "$groupName: String, $description: String, $displayName: String, $notes: String, $commit: String, "
    "$config: JSONString, $host: String, $debug: Boolean, $program: String, $repo: String, "
    "$jobType: String, $state: String, $sweep: String, $tags: [String!], $summaryMetrics: JSONString) {\n"
    "  upsertBucket(input: {id: $id, name: $name, groupName: $groupName, modelName: $project, "
    "entityName: $entity, description: $description, displayName: $displayName, notes: $notes, "
    "config: $config, commit: $commit, host: $host, debug: $debug, jobProgram: $program, jobRepo: $repo, "
    "jobType: $jobType, state: $state, sweep: $sweep, tags: $tags, summaryMetrics: $summaryMetrics}) {\n"
    "    bucket { id name displayName description config sweepName project { id name entity { id name } } "
    "historyLineCount }\n"
    "    inserted\n  }\n}\n";

nlohmann::json OrNull(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }
}  // namespace

std::string ResumeStatusBody(const RunMeta& meta) {
  nlohmann::json body = {
      {"query", kResumeQuery},
      {"variables", {{"project", meta.project}, {"entity", OrNull(meta.entity)}, {"name", meta.run_id}}}};
  return body.dump();
}

absl::StatusOr<ResumeState> ParseResumeStatus(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data")) {
    return absl::InvalidArgumentError(absl::StrCat("RunResumeStatus reply is not GraphQL data: ", body.substr(0, 200)));
  }
  ResumeState out;
  const nlohmann::json& model = j["data"].value("model", nlohmann::json());
  if (model.is_null() || !model.is_object()) return out;  // no such project yet: a new run
  const nlohmann::json& bucket = model.value("bucket", nlohmann::json());
  if (bucket.is_null() || !bucket.is_object()) return out;
  out.exists = true;
  out.history_lines = bucket.value("historyLineCount", int64_t{0});
  // historyTail is a JSON string holding an array of JSON-encoded history lines.
  std::string tail_text = bucket.value("historyTail", std::string("[]"));
  nlohmann::json tail = nlohmann::json::parse(tail_text, nullptr, false);
  if (tail.is_array() && !tail.empty()) {
    const nlohmann::json& last_line = tail.back();
    nlohmann::json last =
        last_line.is_string() ? nlohmann::json::parse(last_line.get<std::string>(), nullptr, false) : last_line;
    if (last.is_object()) {
      out.last_step = last.value("_step", int64_t{-1});
      out.runtime = last.value("_runtime", 0.0);
    }
  }
  return out;
}

std::string UpsertBucketBody(const RunMeta& meta, const std::string& summary_json) {
  nlohmann::json vars = {{"name", meta.run_id},
                         {"project", meta.project},
                         {"entity", OrNull(meta.entity)},
                         {"groupName", OrNull(meta.group)},
                         {"displayName", OrNull(meta.display_name)},
                         {"jobType", meta.job_type},
                         {"tags", meta.tags},
                         {"config", meta.config_json},
                         {"host", OrNull(meta.host)},
                         {"program", meta.program}};
  if (!summary_json.empty()) vars["summaryMetrics"] = summary_json;
  return nlohmann::json({{"query", kUpsertMutation}, {"variables", vars}}).dump();
}

absl::StatusOr<UpsertResult> ParseUpsertBucket(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("UpsertBucket reply is not JSON: ", body.substr(0, 200)));
  }
  if (j.contains("errors") && !j["errors"].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("UpsertBucket failed: ", j["errors"].dump().substr(0, 300)));
  }
  try {
    const nlohmann::json& project = j.at("data").at("upsertBucket").at("bucket").at("project");
    return UpsertResult{project.at("entity").at("name").get<std::string>(), project.at("name").get<std::string>()};
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("UpsertBucket reply lacks bucket.project: ", body.substr(0, 300)));
  }
}

std::string FileStreamUrl(const std::string& base_url, const std::string& entity, const std::string& project,
                          const std::string& run_id) {
  return absl::StrCat(base_url, "/files/", entity, "/", project, "/", run_id, "/file_stream");
}

namespace {
// As dump() escapes a string, with bytes that are not UTF-8 replaced rather than thrown on.
std::string JsonString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
}  // namespace

HistoryContent::HistoryContent(const std::vector<std::string>& names) {
  keys_.reserve(names.size());
  for (const std::string& name : names) {
    if (name == "_step" || name == "_timestamp" || name == "_runtime") {
      keys_.emplace_back();
      continue;
    }
    // "name": as it stands in a line, then escaped again as the line stands inside the body.
    std::string in_body = JsonString(JsonString(name) + ":");
    keys_.push_back(in_body.substr(1, in_body.size() - 2));
  }
}

void HistoryContent::AppendNumber(double v) {
  if (!std::isfinite(v)) {
    text_ += "null";
    return;
  }
  // dump()'s own conversion (the shortest text that reads back as the same double), so a line
  // reads as it did when nlohmann wrote it.
  std::array<char, 64> buf;
  char* end = nlohmann::detail::to_chars(buf.data(), buf.data() + buf.size(), v);
  text_.append(buf.data(), end);
}

void HistoryContent::AddLine(int64_t step, double timestamp, double runtime, absl::Span<const NamedValue> values) {
  if (lines_ > 0) text_ += ',';
  text_ += "\"{";
  for (const NamedValue& v : values) {
    if (v.name >= keys_.size() || keys_[v.name].empty()) continue;
    text_ += keys_[v.name];
    AppendNumber(v.value);
    text_ += ',';
  }
  absl::StrAppend(&text_, "\\\"_step\\\":", step, ",\\\"_timestamp\\\":");
  AppendNumber(timestamp);
  text_ += ",\\\"_runtime\\\":";
  AppendNumber(runtime);
  text_ += "}\"";
  ++lines_;
}

// The body's keys in the order nlohmann writes an object's (sorted), as the SDK's bodies have them.
std::string FileStreamBody(int64_t offset, const HistoryContent& history,
                           const std::optional<std::string>& summary_json, std::optional<int> exitcode) {
  std::string body;
  body.reserve(history.text().size() + (summary_json ? 2 * summary_json->size() : 0) + 160);
  absl::StrAppend(&body, "{\"complete\":", exitcode ? "true" : "false");
  if (exitcode) absl::StrAppend(&body, ",\"exitcode\":", *exitcode);
  body += ",\"files\":{";
  if (history.lines() > 0) {
    absl::StrAppend(&body, "\"wandb-history.jsonl\":{\"content\":[", history.text(), "],\"offset\":", offset, "}");
    if (summary_json) body += ',';
  }
  if (summary_json) {
    absl::StrAppend(&body, "\"wandb-summary.json\":{\"content\":[", JsonString(*summary_json), "],\"offset\":0}");
  }
  body += "}}";
  return body;
}

std::string HeartbeatBody() { return R"({"complete":false,"failed":false})"; }

}  // namespace dt::wandb
