// How dt starts a process (common/subprocess: vfork and exec, as dtrun starts every rank): the
// child begins with an empty signal mask and default handlers, keeps what its starter ignores on
// purpose, and none of the starter's signal handlers ever runs in it before its exec, where it
// would run on the starter's own memory. Real processes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt {
namespace {

void IgnoreInHandler(int) {}

TEST(Subprocess, AChildStartsWithAnEmptyMaskDefaultHandlersAndWhatItsStarterIgnoresOnPurpose) {
  testing::TempDir tmp;
  const std::string out = JoinPath(tmp.path(), "status");
  // This process: SIGUSR1 handled, SIGTERM and SIGPIPE ignored, SIGUSR2 blocked (as a launcher's
  // main loop blocks SIGCHLD).
  struct sigaction handled = {}, ignored = {}, old_usr1 = {}, old_term = {}, old_pipe = {};
  handled.sa_handler = IgnoreInHandler;
  ignored.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGUSR1, &handled, &old_usr1), 0);
  ASSERT_EQ(::sigaction(SIGTERM, &ignored, &old_term), 0);
  ASSERT_EQ(::sigaction(SIGPIPE, &ignored, &old_pipe), 0);
  sigset_t usr2, old_mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &usr2, &old_mask), 0);

  SpawnOptions o;
  o.output_file = out;
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({"/bin/cat", "/proc/self/status"}, o);
  // This thread's mask is as it was before the spawn, which blocks every signal around vfork.
  sigset_t now;
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, nullptr, &now), 0);
  EXPECT_TRUE(sigismember(&now, SIGUSR2));
  EXPECT_FALSE(sigismember(&now, SIGUSR1));
  EXPECT_FALSE(sigismember(&now, SIGTERM));
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ((*p)->Wait(absl::Seconds(30)), 0);

  std::string status = testing::Slurp(out);
  EXPECT_EQ(testing::SignalMask(status, "SigBlk:"), 0u) << status;
  uint64_t child_ignores = testing::SignalMask(status, "SigIgn:");
  EXPECT_TRUE(testing::MaskHas(child_ignores, SIGTERM)) << "a SIGTERM ignored on purpose (nohup) stays ignored";
  EXPECT_FALSE(testing::MaskHas(child_ignores, SIGPIPE))
      << "SIGPIPE goes back to its default, or writers to a closed pipe spin";
  EXPECT_FALSE(testing::MaskHas(child_ignores, SIGUSR1));
  EXPECT_EQ(testing::SignalMask(status, "SigCgt:"), 0u) << status;
}

// Every spawn has a window between vfork and exec in which the child runs on its starter's memory.
// A signal sent to the child then (here: to the whole process group, many times a second, as
// Slurm's and a terminal's signals are) must not run the starter's handler there, which would act
// for the starter on a signal that was not its own. The scenario runs in a child process of the
// test in a process group of its own, so that the signals reach nothing else.
TEST(Subprocess, AStartersSignalHandlerNeverRunsInAChildBeforeItsExec) {
  pid_t scenario = ::fork();
  ASSERT_GE(scenario, 0);
  if (scenario == 0) {
    static pid_t self = 0;
    static std::atomic<int> foreign_runs{0};
    self = ::getpid();
    if (::setpgid(0, 0) != 0) ::_exit(3);
    struct sigaction handled = {};
    handled.sa_handler = [](int) {
      if (::getpid() != self) foreign_runs.fetch_add(1);
    };
    ::sigaction(SIGUSR1, &handled, nullptr);
    std::atomic<bool> stop{false};
    std::thread signaller([&] {
      while (!stop.load()) {
        ::killpg(0, SIGUSR1);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    int started = 0;
    absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({"/bin/true"});
      if (!p.ok()) ::_exit(4);
      (*p)->Wait(absl::Seconds(10));  // /bin/true, or killed by a SIGUSR1 at its default
      ++started;
    }
    stop = true;
    signaller.join();
    if (started < 50) ::_exit(5);
    ::_exit(foreign_runs.load() == 0 ? 0 : 6);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(scenario, &status, 0), scenario);
  ASSERT_TRUE(WIFEXITED(status)) << DescribeWaitStatus(status);
  EXPECT_NE(WEXITSTATUS(status), 6) << "this process's SIGUSR1 handler ran in a child before its exec";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: setpgid failed; 4: a spawn failed; 5: fewer than 50 spawns in 3 s";
}

TEST(Subprocess, AProgramThatCannotBeExecutedIsRefusedWithTheReason) {
  testing::TempDir tmp;
  const std::string script = JoinPath(tmp.path(), "not-executable.sh");
  ASSERT_TRUE(WriteFileAtomic(script, "#!/bin/sh\necho hi\n").ok());
  ::chmod(script.c_str(), 0644);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({script});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(p.status().message(), script)) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "Permission denied")) << p.status();
}

}  // namespace
}  // namespace dt
