// One-line-per-event logging to stderr: "2026-11-21T06:00:00.123Z I dtcoord] text".
// Tokens and other secrets must never be passed to it.
#pragma once

#include <sstream>
#include <string>

namespace dt {

enum class LogLevel { kInfo, kWarning, kError };

// Name printed in every line (the binary's name); set once at start-up.
void SetLogProgram(std::string name);
// Lines below this level are dropped (default kInfo). DT_LOG_LEVEL=warning|error sets it too.
void SetMinLogLevel(LogLevel level);
// Every line from now on also goes to `fd`, an O_APPEND file that stays open for the rest of the
// process (another thread may be writing a line to it at any time). For a log whose stderr may be
// lost: under Slurm a step's stderr travels through srun on the batch host, and nothing of it
// arrives once that node is gone.
void AlsoLogTo(int fd);

class LogLine {
 public:
  explicit LogLine(LogLevel level);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace dt

#define DT_LOG(level) ::dt::LogLine(::dt::LogLevel::k##level).stream()
