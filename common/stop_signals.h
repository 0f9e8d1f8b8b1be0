// Signals from outside that ask a process to stop: SIGTERM (srun ending a step after another task
// died, scancel, a time limit, systemd) and SIGINT (Ctrl-C). A process that must tell someone
// before it goes (a trainer reporting itself a victim, not a cause) blocks them in every thread
// at the start of main(), before any thread exists, and handles them on one watcher thread:
// no work in a signal handler, and no library thread that receives them by chance.
#pragma once

#include <functional>
#include <string>

namespace dt {

// "SIGTERM"; "signal 70" for a number without a name.
std::string SignalName(int signal);

// Blocks SIGTERM and SIGINT in the calling thread; threads created afterwards inherit the mask.
// Call first thing in main().
void BlockStopSignals();

// Blocks the calling thread until SIGTERM or SIGINT arrives (they must be blocked, see above) and
// returns which.
int WaitForStopSignal();

// Starts, once per process, a detached thread that waits for SIGTERM or SIGINT, calls the
// handler installed at that moment (if any) and then ends the process by that signal as it would
// have without the watcher (a scheduler then sees "Terminated", not an exit code). Call after
// BlockStopSignals(); further calls do nothing.
void WatchStopSignals();

// Installs `on_signal` as the stop handler for the object's lifetime: whatever the handler
// captures by reference must outlive it, and the destructor waits for a handler that is running.
class ScopedStopHandler {
 public:
  explicit ScopedStopHandler(std::function<void(int signal)> on_signal);
  ~ScopedStopHandler();
  ScopedStopHandler(const ScopedStopHandler&) = delete;
  ScopedStopHandler& operator=(const ScopedStopHandler&) = delete;
};

// SIGUSR2 from the scheduler (`#SBATCH --signal=USR2@grace`: a preemption or the time limit is
// near) asks for "checkpoint and stop", not death: WatchPreemptionSignal() installs a handler that
// only sets a flag, which PreemptionRequested() reads (the training loop, once per step).
void WatchPreemptionSignal();
bool PreemptionRequested();

// Ends the process by `signal` with its default action (for paths that must not wait).
[[noreturn]] void DieBySignal(int signal);

}  // namespace dt
