// What a failed child tells the coordinator: the exception torch's `@record` wrote to
// TORCHELASTIC_ERROR_FILE, else what the end of the child's output says (a Python traceback's
// last line names the exception), with the exit code or signal.
#pragma once

#include <string>

namespace dt::run {

struct ChildFailure {
  std::string exception_type;  // "RuntimeError"; empty when unknown
  std::string message;         // the exception's message, else a description of the exit
  std::string stack;           // the traceback, else the last lines of the output
};

// `error_file_json`: the error file's contents (empty when the child wrote none). `output_tail`:
// the end of the child's log. `exit_description`: "exited with code 1", "killed by signal 9".
ChildFailure DescribeChildFailure(const std::string& error_file_json, const std::string& output_tail,
                                  const std::string& exit_description);

// The last `max_lines` lines of `text`, at most `max_bytes` bytes (cut at a line start).
std::string LastLines(const std::string& text, int max_lines, size_t max_bytes);

}  // namespace dt::run
