#include "client/dtrun/child_failure.h"

#include <nlohmann/json.hpp>

#include <regex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/utf8.h"

namespace dt::run {
namespace {

constexpr int kStackLines = 40;
constexpr size_t kStackBytes = 16 * 1024;
constexpr size_t kMessageBytes = 4 * 1024;

// "ValueError: bad value" → {"ValueError", "bad value"}; a Python exception name is a dotted
// identifier ending the way Python's own do (or a user's class deriving from them usually does).
bool SplitException(const std::string& line, std::string* type, std::string* message) {
  static const std::regex kException(
      R"(^([A-Za-z_][A-Za-z0-9_.]*(Error|Exception|Interrupt|Exit|Warning|Failure|Timeout))(: (.*))?$)");
  std::smatch m;
  if (!std::regex_match(line, m, kException)) return false;
  *type = m[1].str();
  *message = m[4].matched ? m[4].str() : "";
  return true;
}

bool FromErrorFile(const std::string& json_text, ChildFailure* out) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("message")) return false;
  const nlohmann::json& m = doc["message"];
  std::string text;
  if (m.is_string()) {
    text = m.get<std::string>();
  } else if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    text = m["message"].get<std::string>();
    const nlohmann::json* extra = m.contains("extraInfo") ? &m["extraInfo"] : nullptr;
    if (extra != nullptr && extra->is_object() && extra->contains("py_callstack") &&
        (*extra)["py_callstack"].is_string()) {
      out->stack = LastLines((*extra)["py_callstack"].get<std::string>(), kStackLines, kStackBytes);
    }
  } else {
    return false;
  }
  if (!SplitException(std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n')))), &out->exception_type,
                      &out->message)) {
    out->message = text;
  } else if (text.find('\n') != std::string::npos) {
    out->message = text.substr(out->exception_type.size() + 2);  // a multi-line message, whole
  }
  return true;
}

}  // namespace

std::string LastLines(const std::string& text, int max_lines, size_t max_bytes) {
  std::vector<absl::string_view> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n');
  size_t first = lines.size();
  size_t bytes = 0;
  while (first > 0 && static_cast<int>(lines.size() - first) < max_lines) {
    size_t more = lines[first - 1].size() + (first == lines.size() ? 0 : 1);
    if (bytes + more > max_bytes) break;
    bytes += more;
    --first;
  }
  if (first == lines.size() && !lines.empty()) {
    // Not even the last line fits: its end.
    absl::string_view last = lines.back();
    return TruncateUtf8(last.substr(last.size() > max_bytes ? last.size() - max_bytes : 0), max_bytes);
  }
  std::vector<absl::string_view> kept(lines.begin() + static_cast<std::ptrdiff_t>(first), lines.end());
  return absl::StrJoin(kept, "\n");
}

ChildFailure DescribeChildFailure(const std::string& error_file_json, const std::string& output_tail,
                                  const std::string& exit_description) {
  ChildFailure out;
  bool from_file = !error_file_json.empty() && FromErrorFile(error_file_json, &out);
  if (!from_file) {
    out.stack = LastLines(output_tail, kStackLines, kStackBytes);
    // A Python traceback ends with "Type: message".
    std::vector<std::string> lines = absl::StrSplit(out.stack, '\n');
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
      std::string line(absl::StripAsciiWhitespace(*it));
      if (line.empty()) continue;
      if (out.stack.find("Traceback (most recent call last):") != std::string::npos) {
        SplitException(line, &out.exception_type, &out.message);
      }
      break;
    }
  }
  out.message = TruncateUtf8(out.message, kMessageBytes);
  out.message = out.message.empty() ? exit_description : absl::StrCat(out.message, " (", exit_description, ")");
  return out;
}

}  // namespace dt::run
