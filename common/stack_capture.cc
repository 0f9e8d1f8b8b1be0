#include "common/stack_capture.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/process_tree.h"
#include "common/subprocess.h"
#include "common/utf8.h"

namespace dt {
namespace {

constexpr size_t kMaxToolOutputBytes = 4 << 20;

std::string ThreadName(pid_t pid, int64_t tid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/task/", tid, "/comm"));
  std::string name;
  std::getline(in, name);
  return ValidUtf8(name);
}

std::string PtraceAdvice() {
  std::string scope;
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  std::getline(in, scope);
  std::string out =
      "ptrace was refused: the capturing process must run as the same user as the program (or hold "
      "CAP_SYS_PTRACE), and no debugger or tracer (gdb, strace) may be attached to it already";
  if (!scope.empty()) {
    absl::StrAppend(
        &out, "; kernel.yama.ptrace_scope is ", scope,
        scope == "0"
            ? ""
            : " (dt declares its capturers with PR_SET_PTRACER; 0 allows any same-user tracer, 3 none at all)");
  }
  return out;
}

// Runs eu-stack on `pid` and fills `out` with its threads, or out->error.
void CaptureNative(pid_t pid, absl::Time deadline, int max_frames, v1::ProcessStacks* out) {
  std::string tool = FindEuStack();
  if (tool.empty()) {
    out->set_error(
        "eu-stack is not installed: install Debian's elfutils package (apt-get install elfutils), or set "
        "DT_EU_STACK to its path");
    return;
  }
  char tmpl[] = "/tmp/dt-stack-XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd < 0) {
    out->set_error(absl::StrCat("cannot create a temporary file: ", std::strerror(errno)));
    return;
  }
  ::close(fd);
  std::string output_path = tmpl;
  SpawnOptions o;
  o.output_file = output_path;
  o.parent_death_signal = SIGKILL;  // a capturer that dies takes its tool along
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Spawn({tool, "-p", absl::StrCat(pid), "-m", "-s", "-n", absl::StrCat(max_frames)}, o);
  if (!p.ok()) {
    ::unlink(output_path.c_str());
    out->set_error(absl::StrCat("cannot run ", tool, ": ", p.status().message()));
    return;
  }
  int status = (*p)->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  bool timed_out = status == -1;
  if (timed_out) {
    (*p)->Signal(SIGKILL);
    (*p)->Wait(absl::Seconds(2));
    // A tracer killed while attached leaves its tracee to the kernel, which detaches it; a stop
    // it had sent may still be pending: the process must not stay stopped.
    ::kill(pid, SIGCONT);
  }
  std::string output = ReadFile(output_path).value_or("");
  ::unlink(output_path.c_str());
  if (output.size() > kMaxToolOutputBytes) output.resize(kMaxToolOutputBytes);
  std::vector<v1::ThreadStack> threads = ParseEuStack(output);
  for (v1::ThreadStack& t : threads) {
    if (t.frames().empty()) continue;  // eu-stack names a thread it then fails to unwind
    t.set_name(ThreadName(pid, t.tid()));
    t.set_main(t.tid() == pid);
    *out->add_threads() = std::move(t);
  }
  if (!out->threads().empty() && !timed_out) return;  // frames shown (exit 1: some frames incomplete)
  std::string said;
  // What the tool said beside the stacks (its messages start with its name, as invoked).
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    bool stack_line = absl::StartsWith(line, "PID ") || absl::StartsWith(line, "TID ") || absl::StartsWith(line, "#") ||
                      absl::StartsWith(line, " ");
    if (!stack_line) absl::StrAppend(&said, said.empty() ? "" : "; ", line);
  }
  said = TruncateUtf8(said, 1024);
  if (timed_out) {
    out->set_error(absl::StrCat("eu-stack did not finish in time", said.empty() ? "" : ": ", said));
  } else if (absl::StrContains(said, "Operation not permitted")) {
    out->set_error(absl::StrCat(PtraceAdvice(), " (", said, ")"));
  } else if (absl::StrContains(said, "No such file or directory") || absl::StrContains(said, "No such process") ||
             ::kill(pid, 0) != 0) {
    out->set_error("the process ended before its stacks were read");
  } else {
    out->set_error(absl::StrCat("eu-stack found no frames (", DescribeWaitStatus(status), ")", ": ",
                                said.empty() ? TruncateUtf8(output, 512) : said));
  }
}

// Asks the interpreter for its frames through the hook's signal and reads its dump.
void CapturePython(const PythonHook& hook, absl::Time deadline, v1::ProcessStacks* out) {
  struct stat st;
  off_t start = ::stat(hook.dump_file.c_str(), &st) == 0 ? st.st_size : 0;
  if (::kill(hook.pid, hook.signal) != 0) {
    out->set_error("the process ended before its stacks were read");
    return;
  }
  off_t last = start;
  absl::Time quiet_since = absl::InfiniteFuture();
  while (absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    off_t size = ::stat(hook.dump_file.c_str(), &st) == 0 ? st.st_size : start;
    if (size != last) {
      last = size;
      quiet_since = absl::Now();
    } else if (size > start && absl::Now() - quiet_since >= absl::Milliseconds(30)) {
      break;  // written, and nothing more for a moment
    }
  }
  if (last <= start) {
    out->set_error(absl::StrCat("the Python process did not answer the stack signal (", hook.signal,
                                ") in time: its interpreter is stopped or in uninterruptible sleep"));
    return;
  }
  std::ifstream in(hook.dump_file, std::ios::binary);
  in.seekg(start);
  std::string dump(static_cast<size_t>(std::min<off_t>(last - start, kMaxToolOutputBytes)), '\0');
  in.read(dump.data(), static_cast<std::streamsize>(dump.size()));
  for (v1::ThreadStack& t : ParseFaulthandler(dump, hook.main_thread)) *out->add_threads() = std::move(t);
  if (out->threads().empty()) out->set_error("the Python process's dump held no frames");
}

void CaptureOne(pid_t pid, const StackCaptureOptions& options, absl::Time deadline, v1::ProcessStacks* out) {
  out->set_pid(pid);
  std::optional<ProcessInfo> info = ReadProcess(pid);
  if (!info) {
    out->set_error("the process ended before its stacks were read");
    return;
  }
  out->set_ppid(info->ppid);
  out->set_command(ValidUtf8(info->comm));
  out->set_state(std::string(1, info->state));
  out->set_cpu_seconds(static_cast<double>(info->cpu_ticks) / static_cast<double>(ClockTicksPerSecond()));
  if (info->state == 'Z') {
    out->set_error("a zombie: it ended and its parent has not collected it");
    return;
  }
  std::optional<PythonHook> hook =
      options.python_hooks_dir.empty() ? std::nullopt : FindPythonHook(options.python_hooks_dir, pid);
  if (hook) {
    out->set_kind("python");
    CapturePython(*hook, deadline, out);
  } else {
    out->set_kind("native");
    CaptureNative(pid, deadline, options.max_frames, out);
  }
}

// "0x00007f..." → its value.
bool ParseHex(absl::string_view text, uint64_t* value) {
  if (!absl::ConsumePrefix(&text, "0x")) return false;
  return absl::SimpleHexAtoi(text, value);
}

}  // namespace

int StackSignal() {
  const char* env = std::getenv(kStackSignalEnv);
  int s = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &s) && s > 0 && s < NSIG) return s;
  return SIGRTMAX - 2;
}

std::string FindEuStack() {
  const char* env = std::getenv("DT_EU_STACK");
  if (env != nullptr && *env != '\0') return ::access(env, X_OK) == 0 ? env : "";
  return FindOnPath("eu-stack");
}

std::vector<v1::ThreadStack> ParseEuStack(const std::string& output) {
  std::vector<v1::ThreadStack> threads;
  v1::StackFrame* last = nullptr;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::ConsumePrefix(&line, "TID ")) {
      int64_t tid = 0;
      (void)absl::SimpleAtoi(absl::StripSuffix(line, ":"), &tid);
      threads.emplace_back().set_tid(tid);
      last = nullptr;
    } else if (absl::StartsWith(line, "#") && !threads.empty()) {
      // "#3  0x000055af196e2241 main - /tmp/t": the number, the address, then the name and module.
      std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(' ', 1));
      absl::string_view rest = parts.size() > 1 ? absl::StripLeadingAsciiWhitespace(parts[1]) : "";
      size_t space = rest.find(' ');
      rest = space == absl::string_view::npos ? "" : rest.substr(space + 1);
      last = threads.back().add_frames();
      if (absl::ConsumePrefix(&rest, "- ")) {  // no symbol, only the module
        last->set_module(ValidUtf8(rest));
        rest = "";
      }
      size_t module = rest.rfind(" - ");
      if (module != absl::string_view::npos) {
        last->set_module(ValidUtf8(rest.substr(module + 3)));
        rest = rest.substr(0, module);
      }
      last->set_function(rest.empty() ? "??" : ValidUtf8(rest));
    } else if (absl::StartsWith(line, "    ") && last != nullptr) {
      // "    /src/x.cc:12:7": the previous frame's source.
      absl::string_view source = absl::StripAsciiWhitespace(line);
      std::vector<absl::string_view> f = absl::StrSplit(source, ':');
      int n = 0;
      if (f.size() >= 3 && absl::SimpleAtoi(f[f.size() - 2], &n)) {
        last->set_line(n);
        last->set_file(ValidUtf8(source.substr(0, source.size() - f.back().size() - f[f.size() - 2].size() - 2)));
      } else if (f.size() == 2 && absl::SimpleAtoi(f[1], &n)) {
        last->set_line(n);
        last->set_file(ValidUtf8(f[0]));
      }
    }
  }
  return threads;
}

std::vector<v1::ThreadStack> ParseFaulthandler(const std::string& dump, uint64_t main_thread) {
  std::vector<v1::ThreadStack> threads;
  for (absl::string_view line : absl::StrSplit(dump, '\n')) {
    absl::string_view header = line;
    bool current = absl::ConsumePrefix(&header, "Current thread ");
    if (current || absl::ConsumePrefix(&header, "Thread ")) {
      // "Thread 0x00007f3c2a1fe700 (most recent call first):"
      uint64_t ident = 0;
      (void)ParseHex(header.substr(0, header.find(' ')), &ident);
      v1::ThreadStack& t = threads.emplace_back();
      t.set_tid(static_cast<int64_t>(ident));
      t.set_main(ident == main_thread);
      if (t.main()) t.set_name("MainThread");
      continue;
    }
    absl::string_view frame = absl::StripLeadingAsciiWhitespace(line);
    if (threads.empty() || !absl::ConsumePrefix(&frame, "File \"")) continue;
    // File "/x/train.py", line 12 in load_batch
    size_t quote = frame.rfind("\", line ");
    if (quote == absl::string_view::npos) continue;
    v1::StackFrame* f = threads.back().add_frames();
    f->set_file(ValidUtf8(frame.substr(0, quote)));
    absl::string_view rest = frame.substr(quote + 8);
    size_t in = rest.find(" in ");
    int n = 0;
    (void)absl::SimpleAtoi(rest.substr(0, in), &n);
    f->set_line(n);
    f->set_function(in == absl::string_view::npos ? "??" : ValidUtf8(rest.substr(in + 4)));
  }
  return threads;
}

std::optional<PythonHook> FindPythonHook(const std::string& hooks_dir, pid_t pid) {
  std::ifstream in(JoinPath(hooks_dir, absl::StrCat(pid, ".hook")));
  if (!in) return std::nullopt;
  PythonHook h;
  std::string line;
  while (std::getline(in, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "pid") (void)absl::SimpleAtoi(kv.second, &h.pid);
    if (kv.first == "start") (void)absl::SimpleAtoi(kv.second, &h.start_ticks);
    if (kv.first == "signal") (void)absl::SimpleAtoi(kv.second, &h.signal);
    if (kv.first == "main_thread") (void)absl::SimpleAtoi(kv.second, &h.main_thread);
    if (kv.first == "dump") h.dump_file = kv.second;
  }
  // The pid must still be the process that wrote the file (pids are reused).
  std::optional<ProcessInfo> now = ReadProcess(pid);
  if (h.pid != pid || h.signal <= 0 || h.dump_file.empty() || !now || now->start_ticks != h.start_ticks) {
    return std::nullopt;
  }
  return h;
}

std::vector<v1::ProcessStacks> CaptureProcessStacks(const std::vector<pid_t>& pids,
                                                    const StackCaptureOptions& options) {
  std::vector<v1::ProcessStacks> out(pids.size());
  absl::Time deadline = absl::Now() + options.timeout;
  int parallel = options.max_parallel > 0 ? options.max_parallel
                                          : std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < pids.size(); k = next++) CaptureOne(pids[k], options, deadline, &out[k]);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(parallel, static_cast<int>(pids.size())); ++t) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  return out;
}

std::string FormatFrames(const v1::ThreadStack& thread, int max_frames) {
  std::string out;
  int n = 0;
  for (const v1::StackFrame& f : thread.frames()) {
    if (n == max_frames) {
      absl::StrAppend(&out, "    … ", thread.frames_size() - n, " more\n");
      break;
    }
    absl::StrAppend(&out, "    #", n++, " ", f.function());
    if (!f.file().empty()) absl::StrAppend(&out, " (", f.file(), f.line() > 0 ? absl::StrCat(":", f.line()) : "", ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string FormatRankStacks(const v1::RankStacks& rank) {
  std::string out = absl::StrCat("rank ", rank.rank(), " on ", rank.node(), " (", rank.host(), "), captured in ",
                                 absl::StrFormat("%.2f", rank.capture_seconds()), " s\n");
  if (!rank.error().empty()) absl::StrAppend(&out, "  capture failed: ", rank.error(), "\n");
  for (const v1::ProcessStacks& p : rank.processes()) {
    absl::StrAppend(&out, "  pid ", p.pid(), " (", p.command(), ", ", p.kind(), ", state ", p.state(), ", ",
                    absl::StrFormat("%.1f", p.cpu_seconds()), " s CPU)\n");
    if (!p.error().empty()) absl::StrAppend(&out, "    no stacks: ", p.error(), "\n");
    for (const v1::ThreadStack& t : p.threads()) {
      absl::StrAppend(&out, "   thread ", t.tid(), t.name().empty() ? "" : absl::StrCat(" ", t.name()),
                      t.main() ? " (main)" : "", ":\n", FormatFrames(t, 64));
    }
  }
  if (!rank.collectives().empty()) {
    absl::StrAppend(&out, "  recent collectives (oldest first):\n");
    for (const v1::CollectiveRecord& c : rank.collectives()) {
      absl::StrAppend(&out, "    #", c.sequence(), " ", c.op(), " ", c.bytes(), " bytes",
                      c.has_ended() ? "" : " (still waiting)", "\n");
    }
  }
  return out;
}

}  // namespace dt
