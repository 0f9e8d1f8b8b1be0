#include "trainer/dataset.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"

namespace dt {
namespace {

absl::Status Malformed(const std::string& path, const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", where, ": ", why));
}

// A record with "text", or an Alpaca record; `where` names it in errors.
absl::StatusOr<std::string> RenderRecord(const nlohmann::json& r, const std::string& path, const std::string& where) {
  if (!r.is_object()) return Malformed(path, where, "expected a JSON object");
  auto text_field = [&](const char* key, bool required) -> absl::StatusOr<std::string> {
    auto it = r.find(key);
    if (it == r.end() || it->is_null()) {
      if (required) return Malformed(path, where, absl::StrCat("missing \"", key, "\""));
      return std::string();
    }
    if (!it->is_string()) return Malformed(path, where, absl::StrCat("\"", key, "\" is not a string"));
    return it->get<std::string>();
  };
  if (r.contains("text")) return text_field("text", true);
  if (!r.contains("instruction") && !r.contains("output")) {
    return Malformed(path, where, "neither \"text\" nor an Alpaca record (\"instruction\", \"output\")");
  }
  absl::StatusOr<std::string> instruction = text_field("instruction", true);
  if (!instruction.ok()) return instruction.status();
  absl::StatusOr<std::string> input = text_field("input", false);
  if (!input.ok()) return input.status();
  absl::StatusOr<std::string> output = text_field("output", true);
  if (!output.ok()) return output.status();
  return RenderAlpaca(*instruction, *input, *output);
}

}  // namespace

std::string RenderAlpaca(const std::string& instruction, const std::string& input, const std::string& output) {
  if (input.empty()) {
    return absl::StrCat(
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\n",
        instruction, "\n\n### Response:\n", output);
  }
  return absl::StrCat(
      "Below is an instruction that describes a task, paired with an input that provides further "
      "context. Write a response that appropriately completes the request.\n\n### Instruction:\n",
      instruction, "\n\n### Input:\n", input, "\n\n### Response:\n", output);
}

absl::StatusOr<std::vector<std::string>> LoadDocuments(const std::string& path) {
  absl::StatusOr<std::string> content = ReadFile(path);
  if (!content.ok()) {
    return absl::NotFoundError(absl::StrCat("cannot read dataset ", path, ": ", content.status().message()));
  }
  return ParseDocuments(path, std::move(*content));
}

absl::StatusOr<std::vector<std::string>> ParseDocuments(const std::string& path, std::string content) {
  std::vector<std::string> docs;
  if (absl::EndsWith(path, ".txt")) {
    if (content.empty()) return Malformed(path, "file", "is empty");
    docs.push_back(std::move(content));
    return docs;
  }
  if (absl::EndsWith(path, ".jsonl")) {
    int line_no = 0;
    for (absl::string_view line : absl::StrSplit(content, '\n')) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
      nlohmann::json r = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
      std::string where = absl::StrCat("line ", line_no);
      if (r.is_discarded()) return Malformed(path, where, "not valid JSON");
      absl::StatusOr<std::string> doc = RenderRecord(r, path, where);
      if (!doc.ok()) return doc.status();
      docs.push_back(std::move(*doc));
    }
  } else if (absl::EndsWith(path, ".json")) {
    nlohmann::json all = nlohmann::json::parse(content, nullptr, false);
    if (all.is_discarded()) return Malformed(path, "file", "not valid JSON");
    if (!all.is_array()) return Malformed(path, "file", "expected a JSON array of records");
    for (size_t i = 0; i < all.size(); ++i) {
      absl::StatusOr<std::string> doc = RenderRecord(all[i], path, absl::StrCat("record ", i));
      if (!doc.ok()) return doc.status();
      docs.push_back(std::move(*doc));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("dataset ", path, " must end in .json (Alpaca), .jsonl or .txt"));
  }
  if (docs.empty()) return Malformed(path, "file", "holds no records");
  return docs;
}

}  // namespace dt
