// UTF-8 for strings the coordinator stores and returns: protobuf refuses to parse a string field
// that is not valid UTF-8, so one bad byte in a stored failure makes every reply that carries it
// fail ("No message returned") — cut only at character boundaries, and repair what arrives from
// outside (a process's stderr, srun's output) before it goes into a message. (protobuf's own
// validator is internal API, gone from later releases.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace dt {

bool IsValidUtf8(absl::string_view text);

// The number of characters (code points), or -1 when `text` is not valid UTF-8.
int64_t Utf8Length(absl::string_view text);

// `text` with each byte that does not start or continue a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points beyond U+10FFFF included) replaced by U+FFFD.
std::string ValidUtf8(absl::string_view text);

// `text` safe to print on a terminal: control characters other than newline and tab (ESC among
// them: colours, cursor moves, title changes), DEL and the C1 controls become "\x1b"-style escapes,
// and bytes that are not UTF-8 become U+FFFD.
std::string PrintableForTerminal(absl::string_view text);

// ValidUtf8(text), cut to at most `max_bytes` at a character boundary.
std::string TruncateUtf8(absl::string_view text, size_t max_bytes);

// `text` as valid UTF-8 of at most about `max_bytes`: whole when it fits, else its head and its
// tail (the start of a message says what failed, its end often why) around a line saying how much
// was cut. Reads only the parts it keeps, so a 100 MB message costs what the result does.
std::string HeadAndTailUtf8(absl::string_view text, size_t max_bytes);

}  // namespace dt
