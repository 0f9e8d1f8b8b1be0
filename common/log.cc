#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dt {
namespace {

std::mutex& ProgramMutex() {
  static std::mutex mu;
  return mu;
}
std::string& Program() {
  static std::string name = "dt";
  return name;
}

LogLevel LevelFromEnv() {
  const char* env = std::getenv("DT_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string v = absl::AsciiStrToLower(env);
  if (v == "warning" || v == "warn") return LogLevel::kWarning;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& SecondFd() {
  static std::atomic<int> fd{-1};
  return fd;
}

std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

}  // namespace

void SetLogProgram(std::string name) {
  std::lock_guard<std::mutex> lock(ProgramMutex());
  Program() = std::move(name);
}

void SetMinLogLevel(LogLevel level) { MinLevel() = static_cast<int>(level); }

void AlsoLogTo(int fd) { SecondFd() = fd; }

LogLine::LogLine(LogLevel level) : level_(level) {}

LogLine::~LogLine() {
  if (static_cast<int>(level_) < MinLevel().load()) return;
  static constexpr char kLetters[] = {'I', 'W', 'E'};
  std::string program;
  {
    std::lock_guard<std::mutex> lock(ProgramMutex());
    program = Program();
  }
  std::string line = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  line += ' ';
  line += kLetters[static_cast<int>(level_)];
  line += ' ';
  line += program;
  line += "] ";
  line += stream_.str();
  line += '\n';
  // One write(2) per line so lines of concurrent threads and processes do not interleave.
  // The file first: a stderr that cannot drain (a pipe to srun on a lost node) blocks this write.
  ssize_t unused = 0;
  if (int fd = SecondFd().load(); fd >= 0) unused = ::write(fd, line.data(), line.size());
  unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace dt
