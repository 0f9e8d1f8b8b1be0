// The stacks of a rank's processes, read without stopping them for more than a moment and without
// their cooperation where possible:
// - native frames (every thread, function names, file:line where debug information exists) from
//   `eu-stack` (Debian's elfutils), which attaches with ptrace, unwinds and detaches;
// - Python frames (every thread, file:line and function) from the interpreter itself: dtrun puts a
//   `sitecustomize` hook on the program's PYTHONPATH (python/dt_site/), which registers
//   faulthandler on a real-time signal and says so in a hook file; the capture sends the signal
//   and reads what the interpreter wrote. No ptrace, and a script that never imports dt has it.
// A capture is bounded in time; one that fails (tool missing, ptrace refused, process gone) says
// why in ProcessStacks.error and never ends the caller.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "dt/v1/stacks.pb.h"

namespace dt {

// Where the Python hook registers processes: dtrun sets it per rank in the program's environment.
inline constexpr char kPythonHooksDirEnv[] = "DT_STACKS_DIR";
// The signal the hook registers faulthandler on (default SIGRTMAX - 2); DT_STACK_SIGNAL overrides.
inline constexpr char kStackSignalEnv[] = "DT_STACK_SIGNAL";
int StackSignal();

struct StackCaptureOptions {
  absl::Duration timeout = absl::Seconds(5);  // for all the processes together
  std::string python_hooks_dir;               // empty: no Python hook (native frames only)
  int max_parallel = 0;                       // captures at once; 0: twice the cores, at least 4
  int max_frames = 64;                        // per thread
};

// The stacks of each of `pids`, in that order, captured in parallel.
std::vector<v1::ProcessStacks> CaptureProcessStacks(const std::vector<pid_t>& pids, const StackCaptureOptions& options);

// The eu-stack to run: $DT_EU_STACK, else eu-stack on PATH; empty when there is none.
std::string FindEuStack();

// Parsing, exposed for tests.
// eu-stack's output (with -m -s): the threads in the order it printed them.
std::vector<v1::ThreadStack> ParseEuStack(const std::string& output);
// faulthandler's dump of all threads; `main_thread` is threading.main_thread().ident.
std::vector<v1::ThreadStack> ParseFaulthandler(const std::string& dump, uint64_t main_thread);

// A registration the Python hook wrote for process `pid`, if it is still that process's.
struct PythonHook {
  pid_t pid = 0;
  uint64_t start_ticks = 0;
  int signal = 0;
  uint64_t main_thread = 0;
  std::string dump_file;
};
std::optional<PythonHook> FindPythonHook(const std::string& hooks_dir, pid_t pid);

// "#0 all_reduce (distributed_c10d.py:1536)" lines, innermost first, for people.
std::string FormatFrames(const v1::ThreadStack& thread, int max_frames);
// A whole rank's capture as text (every process, every thread).
std::string FormatRankStacks(const v1::RankStacks& rank);

}  // namespace dt
