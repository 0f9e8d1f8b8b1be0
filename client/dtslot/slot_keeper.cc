#include "client/dtslot/slot_keeper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/dtslot/output_relay.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/process_tree.h"
#include "common/stop_signals.h"
#include "common/subprocess.h"

namespace dt::slot {
namespace {

// The signals dtslot takes as "stop the rank", and those it leaves to the program.
sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2}) sigaddset(&set, s);
  return set;
}

bool IsStopSignal(int s) { return s == SIGTERM || s == SIGINT || s == SIGHUP || s == SIGQUIT; }

class Keeper {
 public:
  explicit Keeper(const SlotOptions& options) : options_(options) {}

  int Run() {
    sigset_t handled = HandledSignals();
    ::sigprocmask(SIG_BLOCK, &handled, nullptr);
    BecomeChildSubreaper();
    // The program and its tree must not hold the status pipe: its end of file means dtslot is gone.
    if (options_.status_fd >= 0) ::fcntl(options_.status_fd, F_SETFD, FD_CLOEXEC);
    // A reader gone (the status pipe's, the log's) fails the write instead of killing the keeper.
    // The program starts with SIGPIPE at its default again (Subprocess resets it).
    ::signal(SIGPIPE, SIG_IGN);
    SpawnOptions o;
    o.new_process_group = true;
    o.parent_death_signal = SIGKILL;  // a dtslot killed by SIGKILL takes the program with it
    o.ptracer = ::getppid();          // the starter (dtrun) captures the program's stacks
    std::unique_ptr<OutputRelay> relay;
    if (!options_.times_file.empty()) {
      absl::StatusOr<std::unique_ptr<OutputRelay>> r = OutputRelay::Start(STDOUT_FILENO, options_.times_file);
      if (r.ok()) {
        relay = std::move(*r);
        o.output_fd = relay->write_fd();
      } else {
        DT_LOG(Warning) << "the program writes to the log directly (its lines are not timed): " << r.status();
      }
    }
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(options_.command, o);
    if (relay) relay->CloseWriteEnd();
    if (!p.ok()) {
      DT_LOG(Error) << p.status();
      return 127;
    }
    (*p)->Release();  // reaped here, with every orphan of the tree
    program_ = (*p)->pid();
    // Everything dtslot acts on arrives as a signal: a child's end (the tree's orphans come here
    // too), a stop, or the death of dtslot's starter (its death signal); the wait's timeout serves
    // only the grace. The check comes before the wait, so dtslot ends as soon as the last process
    // of its tree has.
    while (true) {
      Reap();
      if (program_ended_ && stop_began_ == absl::InfiniteFuture() && !Descendants(::getpid()).empty()) {
        BeginStop("the program ended");
      }
      if (stop_began_ != absl::InfiniteFuture() && absl::Now() >= stop_began_ + options_.grace) KillRest();
      if (Done()) break;
      WaitForSignal(handled);
    }
    if (relay) relay->Join();  // the tree is gone: the pipe has ended
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    if (WIFSIGNALED(status_)) return -WTERMSIG(status_);
    return 1;
  }

 private:
  // The program and every process of its tree are gone.
  bool Done() {
    if (!program_ended_) return false;
    Reap();
    errno = 0;
    int status;
    return ::waitpid(-1, &status, WNOHANG) < 0 && errno == ECHILD;
  }

  void Reap() {
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (pid == program_) {
        program_ended_ = true;
        status_ = status;
        TellStatus();
      }
    }
  }

  // The program's status to the starter, at once (SlotOptions::status_fd).
  void TellStatus() {
    if (options_.status_fd < 0) return;
    std::string line = absl::StrCat(status_, "\n");
    (void)WriteFully(options_.status_fd, line.data(), line.size());  // EPIPE: the starter is gone
    ::close(options_.status_fd);
  }

  void BeginStop(const char* why) {
    stop_began_ = absl::Now();
    std::vector<pid_t> tree = Descendants(::getpid());
    DT_LOG(Info) << why << ": SIGTERM to the " << tree.size() << " process(es) of the slot, SIGKILL after "
                 << absl::FormatDuration(options_.grace);
    SignalProcesses(tree, SIGTERM);
  }

  void KillRest() {
    std::vector<pid_t> tree = Descendants(::getpid());
    if (tree.empty()) return;
    if (!killed_) {
      DT_LOG(Warning) << tree.size() << " process(es) of the slot outlived the grace of "
                      << absl::FormatDuration(options_.grace) << "; SIGKILL";
      killed_ = true;
    }
    SignalProcesses(tree, SIGKILL);  // again each round: a process forking meanwhile
  }

  // Up to 50 ms while stopping (the grace's end needs no signal), else up to a second: nothing
  // but a signal has anything for dtslot to do then, and a program's run costs it one wakeup a
  // second instead of twenty.
  void WaitForSignal(const sigset_t& handled) {
    absl::Duration most = stop_began_ == absl::InfiniteFuture() ? absl::Seconds(1) : absl::Milliseconds(50);
    timespec wait = absl::ToTimespec(most);
    siginfo_t info;
    int s = ::sigtimedwait(&handled, &info, &wait);
    if (s > 0 && IsStopSignal(s) && stop_began_ == absl::InfiniteFuture()) {
      BeginStop(SignalName(s).c_str());
    }
  }

  const SlotOptions& options_;
  pid_t program_ = -1;
  bool program_ended_ = false;
  int status_ = 0;
  absl::Time stop_began_ = absl::InfiniteFuture();
  bool killed_ = false;
};

}  // namespace

int RunSlot(const SlotOptions& options) { return Keeper(options).Run(); }

}  // namespace dt::slot
