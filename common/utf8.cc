#include "common/utf8.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dt {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed sequence at the start of `s` (RFC 3629, table 3-7 of the Unicode
// standard), or 0 when it is not one.
size_t SequenceLength(absl::string_view s) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  auto in = [&](size_t i, unsigned lo, unsigned hi) { return i < s.size() && byte(i) >= lo && byte(i) <= hi; };
  unsigned b0 = byte(0);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return in(1, 0x80, 0xBF) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80;  // no overlong forms
    unsigned hi = b0 == 0xED ? 0x9F : 0xBF;  // no surrogates
    return in(1, lo, hi) && in(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    unsigned lo = b0 == 0xF0 ? 0x90 : 0x80;  // no overlong forms
    unsigned hi = b0 == 0xF4 ? 0x8F : 0xBF;  // nothing beyond U+10FFFF
    return in(1, lo, hi) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

}  // namespace

bool IsValidUtf8(absl::string_view text) { return Utf8Length(text) >= 0; }

int64_t Utf8Length(absl::string_view text) {
  int64_t count = 0;
  while (!text.empty()) {
    size_t n = SequenceLength(text);
    if (n == 0) return -1;
    text.remove_prefix(n);
    ++count;
  }
  return count;
}

std::string PrintableForTerminal(absl::string_view text) {
  std::string valid = ValidUtf8(text);
  std::string out;
  out.reserve(valid.size());
  for (size_t i = 0; i < valid.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(valid[i]);
    bool c1 = c == 0xC2 && i + 1 < valid.size() && static_cast<unsigned char>(valid[i + 1]) <= 0x9F;
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else if (c1) {
      absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(valid[i + 1]), absl::kZeroPad2));
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string ValidUtf8(absl::string_view text) {
  if (IsValidUtf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  while (!text.empty()) {
    size_t n = SequenceLength(text);
    if (n == 0) {
      out += kReplacement;
      n = 1;
    } else {
      out.append(text.data(), n);
    }
    text.remove_prefix(n);
  }
  return out;
}

std::string HeadAndTailUtf8(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return ValidUtf8(text);
  size_t half = max_bytes / 2;
  // Up to 3 bytes more than kept, so the cut falls at a character boundary of the original.
  std::string head = TruncateUtf8(text.substr(0, half + 3), half);
  size_t from = text.size() - half;
  while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  std::string tail = ValidUtf8(text.substr(from));
  size_t cut = from - std::min(from, half);  // about: replaced bytes change the head's length
  return absl::StrCat(head, "\n… [", cut, " bytes cut] …\n", tail);
}

std::string TruncateUtf8(absl::string_view text, size_t max_bytes) {
  std::string valid = ValidUtf8(text);
  if (valid.size() <= max_bytes) return valid;
  size_t end = max_bytes;
  // Step back over continuation bytes to the start of the character that does not fit.
  while (end > 0 && (static_cast<unsigned char>(valid[end]) & 0xC0) == 0x80) --end;
  valid.resize(end);
  return valid;
}

}  // namespace dt
