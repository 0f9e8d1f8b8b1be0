// Child processes: started with vfork and exec, an environment added to this one's, output to a
// file; signalled, waited for with a timeout, killed and reaped when the object dies (unless
// released). Used by the local launcher, dtctl's pre-flight checks, and the tests.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dt {

struct SpawnOptions {
  std::map<std::string, std::string> env;  // added to (or overriding) this process's environment
  std::string output_file;                 // stdout and stderr appended here; empty: inherited
  int output_fd = -1;                      // or: stdout and stderr are this descriptor (a pipe)
  bool new_session = false;                // setsid(): not killed with the parent's terminal
  bool new_process_group = false;          // setpgid(0, 0): its own group (ignored with new_session)
  // PR_SET_PDEATHSIG: the signal the child gets when the *thread* that started it ends (this
  // process's death by SIGKILL included). Start such children from a thread that lives as long
  // as they should (the main thread). 0: none.
  int parent_death_signal = 0;
  // PR_SET_PTRACER: this process (and what it starts, such as a stack capture tool) may attach to
  // the child under Yama's ptrace_scope 1, where only ancestors may by default. 0: no change.
  pid_t ptracer = 0;
  // A descriptor the child keeps, under the same number, although it was opened O_CLOEXEC: made
  // inheritable in this child only, so children that other threads start meanwhile do not hold
  // it (the end of a pipe whose end-of-file must mean this child is gone). -1: none.
  int keep_fd = -1;
};

class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv,
                                                           const SpawnOptions& options = {});
  // Throws std::runtime_error when the program cannot be started (tests).
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env = {}, std::string log_file = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // The raw wait status once it exited; -1 if still running after `timeout`.
  int Wait(absl::Duration timeout);
  bool running();
  // Leaves the child to someone else: this object neither kills nor waits for it any more, and
  // an orphan reaper (ReapIfNotOwned) may collect it.
  void Release();

 private:
  Subprocess() = default;
  absl::Status Start(const std::vector<std::string>& argv, const SpawnOptions& options);

  pid_t pid_ = -1;
  bool reaped_ = false;
  bool released_ = false;
  int status_ = 0;
};

// SIGTERM (and SIGCONT, for a stopped one) to every process, then SIGKILL to each still running
// `grace` later (logged); returns
// each one's wait status (-1 if it could not be reaped). For launchers stopping their children.
std::vector<int> StopProcesses(const std::vector<Subprocess*>& processes, absl::Duration grace);

// Reaps `pid` if it is a child of this process that no live Subprocess owns and it has exited
// (a live one is left running: the wait does not block); true if it was reaped. The one way an orphan reaper waits, so
// it never takes the exit status a Subprocess is waiting for (a stack capture's eu-stack, a rank's dtslot): those pids
// are registered from vfork, under the same lock, until their owner reaps or releases them.
bool ReapIfNotOwned(pid_t pid);

// For a parent whose main loop waits for its children: blocks SIGCHLD in the calling thread,
// and in the threads created afterwards, which inherit the mask (call before any thread exists,
// or a library thread may take the signal and drop it). Subprocess's children start with an
// empty mask.
void BlockChildSignal();

// Waits until SIGCHLD arrives (a child, or an orphan inherited as a subreaper, ended or stopped)
// or `timeout` passes; true on SIGCHLD. Signals coalesce: reap every child after it.
bool WaitForChildSignal(absl::Duration timeout);

// "exited with code 3", "killed by signal 9 (SIGKILL)".
std::string DescribeWaitStatus(int status);

// Runs a command to completion (up to `timeout`), returning its exit code and output.
struct CommandResult {
  int exit_code = -1;  // -1: did not finish or was signalled
  std::string output;
};
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                                         const std::map<std::string, std::string>& env = {});

// The directory of the running executable (/proc/self/exe).
std::string ExecutableDir();

// Finds `name` on PATH; empty when missing.
std::string FindOnPath(const std::string& name);

// Whether `program` can be started: a name without '/' must be on PATH; a path must be an
// executable regular file. FAILED_PRECONDITION saying which and what to do.
absl::Status CheckExecutable(const std::string& program);

}  // namespace dt
