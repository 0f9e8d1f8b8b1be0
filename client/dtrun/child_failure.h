// What a failed child tells the coordinator: the exception torch's `@record` wrote to
// TORCHELASTIC_ERROR_FILE, else what the end of the child's output says (a Python traceback's
// last line names the exception), with the exit code or signal.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace dt::run {

struct ChildFailure {
  std::string exception_type;  // "RuntimeError"; empty when unknown
  std::string message;         // the exception's message, else a description of the exit
  std::string stack;           // the traceback, else the last lines of the output
};

// Error files larger than this are not parsed (their head is reported instead).
inline constexpr size_t kMaxErrorFileBytes = 256 << 20;

// `error_file`: the path of the error file the child may have written (empty: none). `output_tail`:
// the end of the child's log. `exit_description`: "exited with code 1", "killed by signal 9".
// Any size and any bytes: the texts returned are valid UTF-8 and bounded (a long message keeps its
// head and tail), so the report is never refused for its content.
ChildFailure DescribeChildFailure(const std::string& error_file, const std::string& output_tail,
                                  const std::string& exit_description);

// The last `max_lines` lines of `text`, at most `max_bytes` bytes (cut at a line start), valid
// UTF-8.
std::string LastLines(const std::string& text, int max_lines, size_t max_bytes);

// "ValueError: bad value" → type "ValueError", message "bad value"; false when the line does not
// start with an exception's name. Linear in the line's length.
bool SplitException(absl::string_view line, std::string* type, std::string* message);

}  // namespace dt::run
