#include "client/dtrun/child_failure.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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
// The first line of a message is looked at up to here for an exception's name.
constexpr size_t kFirstLineBytes = 1024;

bool EndsWithExceptionWord(absl::string_view name) {
  for (absl::string_view suffix : {"Error", "Exception", "Interrupt", "Exit", "Warning", "Failure", "Timeout"}) {
    if (absl::EndsWith(name, suffix)) return true;
  }
  return false;
}

bool IsNameStart(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

}  // namespace

// "ValueError: bad value" → {"ValueError", "bad value"}: a Python exception's name is a dotted
// identifier ending the way Python's own do (or a user's class deriving from them usually does).
// One pass over the line, whatever its length: no backtracking.
bool SplitException(absl::string_view line, std::string* type, std::string* message) {
  size_t end = 0;
  if (line.empty() || !IsNameStart(line[0])) return false;
  while (end < line.size() && IsNameChar(line[end])) ++end;
  absl::string_view name = line.substr(0, end);
  if (!EndsWithExceptionWord(name)) return false;
  absl::string_view rest = line.substr(end);
  if (!rest.empty() && !absl::StartsWith(rest, ": ")) return false;
  *type = std::string(name);
  *message = rest.empty() ? "" : std::string(rest.substr(2));
  return true;
}

namespace {

// JSON that may hold bytes that are not UTF-8, or escapes of lone surrogates (Python's json.dump of
// text decoded with surrogateescape writes "\udcff"), both of which a strict parser refuses: they
// become U+FFFD, so the exception in the file is not lost for one bad character.
nlohmann::json ParseLeniently(std::string text) {
  text = ValidUtf8(text);
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) return doc;
  // "\uD800".."\uDFFF" → "\uFFFD" (a valid pair becomes two replacements: rare, and harmless).
  for (size_t at = text.find("\\u"); at != std::string::npos; at = text.find("\\u", at + 2)) {
    size_t backslashes = 0;
    while (at >= backslashes + 1 && text[at - backslashes - 1] == '\\') ++backslashes;
    if (backslashes % 2 == 1 || at + 6 > text.size()) continue;  // an escaped backslash, or cut short
    char d = static_cast<char>(absl::ascii_tolower(static_cast<unsigned char>(text[at + 2])));
    char h = static_cast<char>(absl::ascii_tolower(static_cast<unsigned char>(text[at + 3])));
    if (d == 'd' && h >= '8' && (h <= '9' || (h >= 'a' && h <= 'f'))) text.replace(at + 2, 4, "fffd");
  }
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// Torch's error file (TORCHELASTIC_ERROR_FILE, written by `@record`): {"message": "..."} or
// {"message": {"message": "...", "extraInfo": {"py_callstack": "..."}}}. Files up to
// kMaxErrorFileBytes are parsed; every text kept is cut to its head and tail.
bool FromErrorFile(const std::string& path, ChildFailure* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0);
  if (size <= 0) return false;
  if (size > static_cast<std::streamoff>(kMaxErrorFileBytes)) {
    out->message = absl::StrCat("the error file ", path, " is ", size, " bytes, more than the ", kMaxErrorFileBytes,
                                " dt reads; its head: ");
    std::string head(kMessageBytes, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    absl::StrAppend(&out->message, TruncateUtf8(head, kMessageBytes));
    return true;
  }
  std::string contents(static_cast<size_t>(size), '\0');
  in.read(contents.data(), size);
  contents.resize(static_cast<size_t>(in.gcount()));
  nlohmann::json doc = ParseLeniently(std::move(contents));
  if (!doc.is_object() || !doc.contains("message")) return false;
  const nlohmann::json& m = doc["message"];
  const std::string* text = nullptr;
  if (m.is_string()) {
    text = m.get_ptr<const std::string*>();
  } else if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    text = m["message"].get_ptr<const std::string*>();
    const nlohmann::json* extra = m.contains("extraInfo") ? &m["extraInfo"] : nullptr;
    if (extra != nullptr && extra->is_object() && extra->contains("py_callstack") &&
        (*extra)["py_callstack"].is_string()) {
      out->stack = LastLines(*(*extra)["py_callstack"].get_ptr<const std::string*>(), kStackLines, kStackBytes);
    }
  } else {
    return false;
  }
  absl::string_view whole = *text;
  absl::string_view first = whole.substr(0, std::min(whole.find('\n'), kFirstLineBytes));
  if (SplitException(absl::StripAsciiWhitespace(first), &out->exception_type, &out->message)) {
    // The message is everything after "Type: ", however many lines.
    size_t at = whole.find(out->exception_type);
    absl::string_view rest = whole.substr(at + out->exception_type.size());
    if (absl::StartsWith(rest, ": ")) rest.remove_prefix(2);
    out->message = HeadAndTailUtf8(rest, kMessageBytes);
  } else {
    out->message = HeadAndTailUtf8(whole, kMessageBytes);
  }
  out->exception_type = TruncateUtf8(out->exception_type, 256);
  return true;
}

}  // namespace

std::string LastLines(const std::string& text, int max_lines, size_t max_bytes) {
  // Only the end can be kept: look at no more than it (a 100 MB line costs its last max_bytes).
  absl::string_view view = absl::StripTrailingAsciiWhitespace(text);
  if (view.size() > max_bytes + 1) view = view.substr(view.size() - max_bytes - 1);
  std::vector<absl::string_view> lines = absl::StrSplit(view, '\n');
  bool first_whole = view.size() == absl::StripTrailingAsciiWhitespace(text).size();
  size_t first = lines.size();
  size_t bytes = 0;
  while (first > 0 && static_cast<int>(lines.size() - first) < max_lines) {
    if (first == 1 && !first_whole) break;  // the line the window cut into
    size_t more = lines[first - 1].size() + (first == lines.size() ? 0 : 1);
    if (bytes + more > max_bytes) break;
    bytes += more;
    --first;
  }
  if (first == lines.size() && !lines.empty()) {
    // Not even the last line fits: its end, starting at a character.
    absl::string_view last = lines.back();
    size_t from = last.size() > max_bytes ? last.size() - max_bytes : 0;
    while (from < last.size() && (static_cast<unsigned char>(last[from]) & 0xC0) == 0x80) ++from;
    return ValidUtf8(last.substr(from));
  }
  std::vector<absl::string_view> kept(lines.begin() + static_cast<std::ptrdiff_t>(first), lines.end());
  return ValidUtf8(absl::StrJoin(kept, "\n"));
}

ChildFailure DescribeChildFailure(const std::string& error_file, const std::string& output_tail,
                                  const std::string& exit_description) {
  ChildFailure out;
  bool from_file = !error_file.empty() && FromErrorFile(error_file, &out);
  if (!from_file) {
    out = ChildFailure();
    out.stack = LastLines(output_tail, kStackLines, kStackBytes);
    // A Python traceback ends with "Type: message": looked for in the whole tail read, so a long
    // message line that the kept stack cuts still names its exception.
    absl::string_view tail = absl::StripTrailingAsciiWhitespace(output_tail);
    if (tail.find("Traceback (most recent call last):") != absl::string_view::npos) {
      size_t nl = tail.rfind('\n');
      absl::string_view last = absl::StripAsciiWhitespace(nl == absl::string_view::npos ? tail : tail.substr(nl + 1));
      SplitException(last, &out.exception_type, &out.message);
    }
  }
  out.exception_type = TruncateUtf8(out.exception_type, 256);
  out.message = HeadAndTailUtf8(out.message, kMessageBytes);
  out.message = out.message.empty() ? exit_description : absl::StrCat(out.message, " (", exit_description, ")");
  return out;
}

}  // namespace dt::run
