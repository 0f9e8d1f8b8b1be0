// A rank's process tree, owned whole: dtslot stops every process under it (a wrapper shell, its
// python, a grandchild that ignores SIGTERM, one that escaped into its own session) and ends as
// the program did; markers find processes that left their tree. Real processes.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/process_tree.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt {
namespace {

std::string Dtslot() { return testing::BinaryPath("dtslot"); }

// A shell that starts a grandchild ignoring SIGTERM, one in a session of its own, and waits.
const char* kStubbornTree =
    "trap '' TERM; "
    "(trap '' TERM; exec sleep 600) & "
    "setsid sleep 600 & "
    "echo started; wait";

TEST(ProcessTree, DtslotStopsItsWholeTreeAndEndsByTheSameSignal) {
  testing::TempDir tmp;
  std::string log = JoinPath(tmp.path(), "slot.log");
  std::string marker = SlotMarker("run-tree-1", 0, "rank-0");
  Subprocess slot({Dtslot(), "--grace", "1", "--", "bash", "-c", kStubbornTree}, {{kSlotMarkerEnv, marker}}, log);
  ASSERT_TRUE(
      testing::WaitFor([&] { return testing::Slurp(log).find("started") != std::string::npos; }, absl::Seconds(10)));
  ASSERT_TRUE(testing::WaitFor([&] { return ProcessesWithMarker(MarkerIn({marker})).size() == 4; },
                               absl::Seconds(5)));  // dtslot, bash, two sleeps
  absl::Time stop = absl::Now();
  slot.Signal(SIGTERM);
  int status = slot.Wait(absl::Seconds(10));
  ASSERT_NE(status, -1) << "dtslot did not end";
  // The shell ignores SIGTERM: SIGKILL after the 1 s grace; dtslot ends as its program did.
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << DescribeWaitStatus(status);
  EXPECT_GE(absl::Now() - stop, absl::Seconds(1));
  EXPECT_TRUE(ProcessesWithMarker(MarkerIn({marker})).empty()) << testing::Slurp(log);
}

TEST(ProcessTree, WhatTheProgramLeavesBehindIsStoppedAndItsExitCodeKept) {
  testing::TempDir tmp;
  std::string marker = SlotMarker("run-tree-2", 3, "rank-1");
  Subprocess slot({Dtslot(), "--grace", "1", "--", "bash", "-c", "setsid sleep 600 & sleep 600 & exit 7"},
                  {{kSlotMarkerEnv, marker}}, JoinPath(tmp.path(), "slot.log"));
  int status = slot.Wait(absl::Seconds(10));
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << DescribeWaitStatus(status);
  EXPECT_TRUE(ProcessesWithMarker(MarkerIn({marker})).empty());
}

// dtslot ends as soon as the last process of its tree has, not at its next look: with nothing to
// stop it waits up to a second for a signal, and its check comes before that wait. (A check after
// the wait would hold every rank's end, and so a restart, by about that second: this test guards
// against that, with room for a loaded machine, not against the 50 ms tick it once had.)
TEST(ProcessTree, DtslotEndsAsSoonAsItsProgramDoes) {
  testing::TempDir tmp;
  const std::string ended = JoinPath(tmp.path(), "ended");
  for (int round = 0; round < 3; ++round) {
    ::unlink(ended.c_str());
    Subprocess slot({Dtslot(), "--", "bash", "-c", absl::StrCat("sleep 0.2; date +%s.%N > ", ended, "; exit 5")}, {},
                    JoinPath(tmp.path(), "slot.log"));
    int status = slot.Wait(absl::Seconds(10));
    absl::Time reaped = absl::Now();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 5) << DescribeWaitStatus(status);
    double seconds = 0;
    ASSERT_TRUE(absl::SimpleAtod(absl::StripAsciiWhitespace(testing::Slurp(ended)), &seconds)) << testing::Slurp(ended);
    absl::Time program_end = absl::FromUnixNanos(static_cast<int64_t>(seconds * 1e9));
    EXPECT_LT(reaped - program_end, absl::Milliseconds(800)) << "round " << round;
  }
}

TEST(ProcessTree, TheDeathOfWhoeverStartedDtslotStopsTheTree) {
  testing::TempDir tmp;
  std::string marker = SlotMarker("run-tree-3", 0, "rank-0");
  // dtrun starts dtslot with PR_SET_PDEATHSIG; the signal fires when the starting thread ends, as
  // it does when dtrun is killed with SIGKILL. Here a thread of the test plays dtrun.
  std::unique_ptr<Subprocess> slot;
  std::thread parent([&] {
    SpawnOptions o;
    o.env[kSlotMarkerEnv] = marker;
    o.parent_death_signal = SIGTERM;
    o.output_file = JoinPath(tmp.path(), "slot.log");
    slot = *Subprocess::Spawn({Dtslot(), "--grace", "1", "--", "bash", "-c", kStubbornTree}, o);
    ASSERT_TRUE(
        testing::WaitFor([&] { return ProcessesWithMarker(MarkerIn({marker})).size() == 4; }, absl::Seconds(10)));
  });
  parent.join();  // the thread that started dtslot ends: its death signal fires
  int status = slot->Wait(absl::Seconds(10));
  ASSERT_NE(status, -1) << "dtslot outlived its parent";
  EXPECT_TRUE(testing::WaitFor([&] { return ProcessesWithMarker(MarkerIn({marker})).empty(); }, absl::Seconds(5)));
}

// Everything a pipe gives until end of file; nothing if that does not come within `timeout`.
std::optional<std::string> ReadPipeUntilEnd(int fd, absl::Duration timeout) {
  std::string out;
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()))) <= 0) break;
    char buf[64];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return out;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return std::nullopt;
}

// dtrun orders a failing group's ranks by when their programs ended. A dtslot stopping what its
// program left (here a child that ignores SIGTERM, for a grace of 60 s) must not make that rank
// look like the last to end: its status comes through --status-fd the moment the program ends,
// with end of file (neither the program nor what it left holds the pipe).
TEST(ProcessTree, DtslotTellsTheProgramsStatusTheMomentItEndsNotWhenItsTreeIsGone) {
  testing::TempDir tmp;
  std::string marker = SlotMarker("run-tree-status", 0, "rank-1");
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  SpawnOptions o;
  o.env = {{kSlotMarkerEnv, marker}};
  o.output_file = JoinPath(tmp.path(), "slot.log");
  o.keep_fd = pipe_fds[1];
  absl::StatusOr<std::unique_ptr<Subprocess>> slot =
      Subprocess::Spawn({Dtslot(), "--grace", "60", "--status-fd", absl::StrCat(pipe_fds[1]), "--", "bash", "-c",
                         "(trap '' TERM; exec sleep 600) & sleep 0.2; exit 7"},
                        o);
  ::close(pipe_fds[1]);
  ASSERT_TRUE(slot.ok()) << slot.status();
  absl::Cleanup close_read = [&] {
    ::close(pipe_fds[0]);
    EndMarkedProcesses(MarkerIn({marker}), absl::ZeroDuration());  // after a failure, too
  };
  std::optional<std::string> told = ReadPipeUntilEnd(pipe_fds[0], absl::Seconds(20));
  ASSERT_TRUE(told.has_value()) << "no end of file while the leftover ran: it holds the status pipe";
  EXPECT_EQ(*told, "1792\n");  // exit code 7, as waitpid gives it
  std::vector<pid_t> left = ProcessesWithMarker(MarkerIn({marker}));
  EXPECT_EQ(left.size(), 2u) << "dtslot and the leftover sleep should still run (it ignores SIGTERM)";
  EXPECT_EQ((*slot)->Wait(absl::ZeroDuration()), -1);
  for (pid_t pid : left) {
    if (pid != (*slot)->pid()) ::kill(pid, SIGKILL);  // rather than wait out the grace
  }
  int status = (*slot)->Wait(absl::Seconds(15));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << DescribeWaitStatus(status);
  EXPECT_TRUE(ProcessesWithMarker(MarkerIn({marker})).empty());
}

// A dtslot that ends before its program tells nothing: its starter reads end of file alone.
TEST(ProcessTree, AKilledDtslotClosesItsStatusPipeWithoutAStatus) {
  testing::TempDir tmp;
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  SpawnOptions o;
  o.output_file = JoinPath(tmp.path(), "slot.log");
  o.keep_fd = pipe_fds[1];
  absl::StatusOr<std::unique_ptr<Subprocess>> slot = Subprocess::Spawn(
      {Dtslot(), "--status-fd", absl::StrCat(pipe_fds[1]), "--", "bash", "-c", "echo started; sleep 600"}, o);
  ::close(pipe_fds[1]);
  ASSERT_TRUE(slot.ok()) << slot.status();
  ASSERT_TRUE(testing::WaitFor([&] { return testing::Slurp(o.output_file).find("started") != std::string::npos; },
                               absl::Seconds(10)));
  (*slot)->Signal(SIGKILL);  // its program dies with it (PR_SET_PDEATHSIG)
  EXPECT_EQ(ReadPipeUntilEnd(pipe_fds[0], absl::Seconds(20)), "");
  int status = (*slot)->Wait(absl::Seconds(10));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << DescribeWaitStatus(status);
}

TEST(ProcessTree, DtslotRefusesAStatusDescriptorItDoesNotHave) {
  for (const char* fd : {"1", "97"}) {
    CommandResult r = testing::RunBinary("dtslot", {"--status-fd", fd, "--", "/bin/true"});
    EXPECT_EQ(r.exit_code, 2) << fd << ": " << r.output;
    EXPECT_NE(r.output.find(absl::StrCat("--status-fd ", fd, " is not an open descriptor")), std::string::npos)
        << r.output;
  }
}

// A program whose output file cannot be opened (its experiment's logs/ was deleted) is not reported
// as a missing program.
TEST(ProcessTree, AnOutputFileThatCannotBeOpenedIsNamed) {
  SpawnOptions o;
  o.output_file = "/nonexistent-dt-dir/logs/rank-0.log";
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({"/bin/true"}, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("its output file /nonexistent-dt-dir/logs/rank-0.log cannot be opened"),
            std::string::npos)
      << p.status();
  EXPECT_NE(p.status().message().find("its directory is gone"), std::string::npos) << p.status();
  absl::StatusOr<std::unique_ptr<Subprocess>> missing = Subprocess::Spawn({"/nonexistent-dt-program"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file or directory"), std::string::npos);
}

TEST(ProcessTree, MarkersNameRunAndGeneration) {
  EXPECT_EQ(SlotMarker("r-1", 4, "rank-2"), "r-1/g4/rank-2");
  EXPECT_EQ(MarkerGeneration("r-1/g4/rank-2"), 4);
  EXPECT_FALSE(MarkerGeneration("something else").has_value());
  EXPECT_TRUE(MarkerBeforeGeneration("r-1", 5)("r-1/g4/node-a"));
  EXPECT_FALSE(MarkerBeforeGeneration("r-1", 4)("r-1/g4/node-a"));
  EXPECT_FALSE(MarkerBeforeGeneration("r-1", 5)("r-10/g4/node-a"));
  EXPECT_TRUE(MarkerOfRun("r-1")("r-1/g0/rank-0"));
  EXPECT_FALSE(MarkerOfRun("r-1")("r-12/g0/rank-0"));
}

TEST(ProcessTree, DescendantsFollowParentLinks) {
  Subprocess shell({"bash", "-c", "sleep 600 & sleep 600 & wait"});
  ASSERT_TRUE(testing::WaitFor([&] { return Descendants(shell.pid()).size() == 2; }, absl::Seconds(5)));
  for (pid_t p : Descendants(shell.pid())) EXPECT_EQ(ReadProcess(p)->ppid, shell.pid());
  SignalProcesses(Descendants(shell.pid()), SIGKILL);
}

// dtrun's tending reads /proc once a tick and serves every rank from that snapshot: its CPU
// count and its orphan reaping must find what a fresh look would.
TEST(ProcessTree, OneSnapshotServesCpuTimeAndOrphanReaping) {
  {
    Subprocess busy({"bash", "-c", "while :; do :; done"});
    ASSERT_TRUE(testing::WaitFor([&] { return CpuTicks({busy.pid()}) >= 5; }, absl::Seconds(10)));
    std::vector<ProcessInfo> all = AllProcesses();
    uint64_t from_snapshot = CpuTicks({busy.pid()}, all);
    EXPECT_GE(from_snapshot, 5u);
    EXPECT_LE(from_snapshot, CpuTicks({busy.pid()}));  // a later fresh look counts at least as much
    EXPECT_EQ(CpuTicks({-1}, all), 0u);                // a pid not in the snapshot counts nothing
  }  // stopped and reaped by its owner: no zombie of it for the reaping below

  // A child a Subprocess owns is left to it; a released one is an orphan to reap.
  Subprocess owned({"bash", "-c", "exit 7"});
  pid_t released_pid;
  {
    Subprocess released({"bash", "-c", "exit 0"});
    released.Release();
    released_pid = released.pid();
  }
  auto zombie_in = [](pid_t pid, const std::vector<ProcessInfo>& procs) {
    return std::any_of(procs.begin(), procs.end(),
                       [pid](const ProcessInfo& p) { return p.pid == pid && p.state == 'Z'; });
  };
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::vector<ProcessInfo> now = AllProcesses();
        return zombie_in(owned.pid(), now) && zombie_in(released_pid, now);
      },
      absl::Seconds(10)));
  std::vector<ProcessInfo> snapshot = AllProcesses();
  EXPECT_GE(ReapOrphans(snapshot), 1);
  int status = 0;
  pid_t again = ::waitpid(released_pid, &status, WNOHANG);
  int error = errno;
  EXPECT_EQ(again, -1);  // reaped already
  EXPECT_EQ(error, ECHILD);
  EXPECT_TRUE(zombie_in(owned.pid(), AllProcesses())) << "an owned child is left to its Subprocess";
  EXPECT_EQ(DescribeWaitStatus(owned.Wait(absl::Seconds(5))), "exited with code 7");
}

// dtrun reaps orphans on its tending thread while other threads start and wait for children of
// their own (a stack capture's eu-stack): the reaper never takes their exit status.
TEST(ProcessTree, OrphanReapingNeverTakesAnOwnedChildsStatus) {
  std::atomic<bool> stop{false};
  std::thread reaper([&] {
    while (!stop.load()) ReapOrphans();
  });
  absl::Cleanup join = [&] {
    stop = true;
    reaper.join();
  };
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({"/bin/sh", "-c", "exit 5"});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(DescribeWaitStatus((*p)->Wait(absl::Seconds(10))), "exited with code 5") << "child " << i;
  }
}

}  // namespace
}  // namespace dt
