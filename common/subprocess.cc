#include "common/subprocess.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/stop_signals.h"

extern char** environ;

namespace dt {

namespace {

// The children live Subprocess objects own. A pid enters at vfork, under the lock an orphan
// reaper holds from its look to its waitpid, so no reaper sees a child in between.
struct OwnedChildren {
  absl::Mutex mu;
  std::vector<pid_t> pids ABSL_GUARDED_BY(mu);
};

OwnedChildren& Owned() {
  static auto* owned = new OwnedChildren;  // never destroyed: children may outlive static destruction
  return *owned;
}

// Removes one entry: once reaped, the pid may already belong to a new child registered beside it.
void Disown(pid_t pid) {
  OwnedChildren& o = Owned();
  absl::MutexLock lock(&o.mu);
  auto it = std::find(o.pids.begin(), o.pids.end(), pid);
  if (it != o.pids.end()) o.pids.erase(it);
}

// SIGCHLD alone: what BlockChildSignal blocks and WaitForChildSignal takes.
sigset_t ChildSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  return set;
}

// Where the child failed before its program ran (written with the errno to the parent).
enum ChildStage : int { kStageSetup = 1, kStageOutput = 2, kStageExec = 3 };

// What the child does between vfork and exec. It runs on the parent's memory (the calling thread
// is suspended until the exec; the others run on), so it changes nothing of the parent's: only
// system calls, no allocation, no locks, no raise() (glibc's reads the parent thread's id).
// Failures are written to `error_pipe` as a stage and an errno, and end the child.
[[noreturn]] void ExecChild(const char* program, char* const* argv, char* const* envp, const SpawnOptions& options,
                            const char* output_file, pid_t parent, int error_pipe) {
  int stage = kStageSetup;
  auto fail = [error_pipe, &stage]() {
    int report[2] = {stage, errno};
    (void)!::write(error_pipe, report, sizeof report);
    ::_exit(127);
  };
  // Every signal is blocked here (Start blocks them around vfork). A handler of the parent's must
  // not run in the child before the exec, on the parent's memory: handled signals go back to their
  // defaults now (exec would reset them anyway). A SIGTERM or SIGINT this process ignores on
  // purpose stays ignored, as under nohup: dtctl rides out the stop of a Slurm requeue, and the
  // scontrol it runs meanwhile must finish too. SIGPIPE and SIGCHLD go back to their defaults (an
  // inherited SIG_IGN for SIGCHLD would reap the child's own children).
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction current = {};
    if (::sigaction(sig, nullptr, &current) != 0) continue;  // glibc's own signals, SIGKILL, SIGSTOP
    bool handled = current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN;
    if (handled || sig == SIGPIPE || sig == SIGCHLD) ::sigaction(sig, &dfl, nullptr);
  }
  if (options.new_session) {
    if (::setsid() < 0) fail();
  } else if (options.new_process_group) {
    if (::setpgid(0, 0) < 0) fail();
  }
  if (options.parent_death_signal != 0) {
    if (::prctl(PR_SET_PDEATHSIG, options.parent_death_signal, 0, 0, 0) < 0) fail();
    // The parent died before the request took effect: act on it now.
    if (::getppid() != parent) ::kill(::getpid(), options.parent_death_signal);
  }
  if (options.ptracer > 0) ::prctl(PR_SET_PTRACER, options.ptracer, 0, 0, 0);  // without Yama: EINVAL, harmless
  if (options.keep_fd >= 0 && ::fcntl(options.keep_fd, F_SETFD, 0) < 0) fail();
  if (options.output_fd >= 0) {
    stage = kStageOutput;
    if (::dup2(options.output_fd, 1) < 0 || ::dup2(options.output_fd, 2) < 0) fail();
  } else if (output_file != nullptr) {
    stage = kStageOutput;
    int fd = ::open(output_file, O_WRONLY | O_CREAT | O_APPEND, 0644);  // no O_CLOEXEC: the child's stdout
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) fail();
    if (fd > 2) ::close(fd);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  stage = kStageExec;
  ::execve(program, argv, envp);
  fail();
  ::_exit(127);  // not reached (fail() exits); tells the compiler so
}

// Everything the child needs, prepared by the parent before vfork: the child allocates nothing.
struct ChildPlan {
  const char* program;
  char* const* argv;
  char* const* envp;
  const SpawnOptions* options;
  const char* output_file;  // or nullptr
  pid_t parent;
  int error_read_end;
  int error_write_end;
};

// vfork, kept to a frame of its own: the child shares this stack until its exec, and nothing the
// parent reads after vfork returns lives in a frame the child runs in (the parent's Start).
[[gnu::noinline]] pid_t StartChild(const ChildPlan* plan) {
  pid_t pid = ::vfork();
  if (pid == 0) {
    ::close(plan->error_read_end);
    ExecChild(plan->program, plan->argv, plan->envp, *plan->options, plan->output_file, plan->parent,
              plan->error_write_end);
  }
  return pid;
}

}  // namespace

absl::Status Subprocess::Start(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : options.env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<std::string> args = argv;
  std::vector<char*> envp, argp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  std::string program = argv[0].find('/') == std::string::npos ? FindOnPath(argv[0]) : argv[0];
  if (program.empty())
    return absl::FailedPreconditionError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(ENOENT)));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot start ", argv[0], ": pipe: ", std::strerror(errno)));
  }
  const ChildPlan plan{program.c_str(),
                       argp.data(),
                       envp.data(),
                       &options,
                       options.output_file.empty() ? nullptr : options.output_file.c_str(),
                       ::getpid(),
                       pipe_fds[0],
                       pipe_fds[1]};
  pid_t pid;
  int fork_errno;
  {
    // vfork, not fork: fork copies this process's page tables and then faults in a copy of every
    // page any of its threads writes until the child's exec (about 9 ms from dtrun's 21 MB,
    // against 2 ms: bench_spawn). Signals stay blocked in this thread until the child has exec'd (ExecChild).
    sigset_t all, before;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &before);
    // Held across vfork: the child never touches it (it execs or exits), and a reaper on another
    // thread cannot take the new pid before it is registered.
    OwnedChildren& owned = Owned();
    absl::MutexLock lock(&owned.mu);
    pid = StartChild(&plan);
    fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    if (pid > 0) owned.pids.push_back(pid);
  }
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start ", argv[0], ": vfork: ", std::strerror(fork_errno)));
  }
  // The pipe closes on a successful exec (O_CLOEXEC) and carries a stage and an errno otherwise.
  int report[2] = {0, 0};
  ssize_t n;
  while ((n = ::read(pipe_fds[0], report, sizeof report)) < 0 && errno == EINTR) {
  }
  ::close(pipe_fds[0]);
  if (n == static_cast<ssize_t>(sizeof report)) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    Disown(pid);
    if (report[0] == kStageOutput) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot start ", argv[0], ": its output file ", options.output_file,
          " cannot be opened: ", std::strerror(report[1]), report[1] == ENOENT ? " (its directory is gone)" : ""));
    }
    return absl::FailedPreconditionError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(report[1])));
  }
  pid_ = pid;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                              const SpawnOptions& options) {
  std::unique_ptr<Subprocess> p(new Subprocess());
  if (absl::Status s = p->Start(argv, options); !s.ok()) return s;
  return p;
}

Subprocess::Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env, std::string log_file) {
  SpawnOptions o;
  o.env = std::move(env);
  o.output_file = std::move(log_file);
  if (absl::Status s = Start(argv, o); !s.ok()) throw std::runtime_error(std::string(s.message()));
}

Subprocess::~Subprocess() {
  if (!reaped_ && !released_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
    Disown(pid_);
  }
}

void Subprocess::Release() {
  if (!released_ && !reaped_ && pid_ > 0) Disown(pid_);
  released_ = true;
}

void Subprocess::Signal(int sig) {
  if (!reaped_ && !released_ && pid_ > 0) ::kill(pid_, sig);  // a released pid may be someone else's now
}

int Subprocess::Wait(absl::Duration timeout) {
  if (reaped_) return status_;
  if (released_) return W_EXITCODE(255, 0);  // not ours to wait for: its status is unknown here
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      Disown(pid_);
      return status_;
    }
    if (r < 0 && errno == ECHILD) {
      // Reaped by someone else (SIGCHLD ignored): the exit status is unknown; do not call it a
      // success.
      reaped_ = true;
      Disown(pid_);
      status_ = W_EXITCODE(255, 0);
      return status_;
    }
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

bool Subprocess::running() { return Wait(absl::ZeroDuration()) == -1; }

bool ReapIfNotOwned(pid_t pid) {
  OwnedChildren& o = Owned();
  absl::MutexLock lock(&o.mu);
  if (std::find(o.pids.begin(), o.pids.end(), pid) != o.pids.end()) return false;
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

void BlockChildSignal() {
  sigset_t child = ChildSignalSet();
  ::pthread_sigmask(SIG_BLOCK, &child, nullptr);
}

bool WaitForChildSignal(absl::Duration timeout) {
  sigset_t child = ChildSignalSet();
  struct timespec wait = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  return ::sigtimedwait(&child, nullptr, &wait) == SIGCHLD;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return absl::StrCat("killed by signal ", sig, " (", SignalName(sig), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                                         const std::map<std::string, std::string>& env) {
  char tmpl[] = "/tmp/dt-cmd-XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd < 0) return absl::InternalError("cannot create a temporary file");
  ::close(fd);
  std::string out_path = tmpl;
  SpawnOptions o;
  o.env = env;
  o.output_file = out_path;
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv, o);
  if (!p.ok()) {
    ::unlink(out_path.c_str());
    return p.status();
  }
  CommandResult result;
  int status = (*p)->Wait(timeout);
  if (status == -1) {
    (*p)->Signal(SIGKILL);
    (*p)->Wait(absl::Seconds(5));
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  absl::StatusOr<std::string> output = ReadFile(out_path);
  ::unlink(out_path.c_str());
  if (output.ok()) result.output = *output;
  if (status == -1) {
    return absl::DeadlineExceededError(absl::StrCat(argv[0], " did not finish within ", absl::FormatDuration(timeout)));
  }
  return result;
}

std::string ExecutableDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return Dirname(std::string(buf, static_cast<size_t>(n)));
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string candidate = JoinPath(dir, name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::vector<int> StopProcesses(const std::vector<Subprocess*>& processes, absl::Duration grace) {
  for (Subprocess* p : processes) {
    p->Signal(SIGTERM);
    p->Signal(SIGCONT);  // a stopped process takes its SIGTERM now, not after the grace (as systemd does)
  }
  absl::Time deadline = absl::Now() + grace;
  std::vector<int> statuses;
  for (Subprocess* p : processes) {
    int status = p->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (status == -1) {
      DT_LOG(Warning) << "pid " << p->pid() << " ignored SIGTERM for " << absl::FormatDuration(grace) << "; killing it";
      p->Signal(SIGKILL);
      status = p->Wait(absl::Seconds(5));
    }
    statuses.push_back(status);
  }
  return statuses;
}

absl::Status CheckExecutable(const std::string& program) {
  if (program.find('/') == std::string::npos) {
    if (!FindOnPath(program).empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(program, " is not on PATH; give its path, e.g. /usr/bin/python3 train.py"));
  }
  struct stat st;
  if (::stat(program.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(program, " does not exist"));
  }
  if (!S_ISREG(st.st_mode) || ::access(program.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        program, " is not an executable file (chmod +x it, or run it through its interpreter: python3 ", program, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dt
