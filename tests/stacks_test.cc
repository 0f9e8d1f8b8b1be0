// Stack captures of real processes (eu-stack for native frames, the sitecustomize hook for Python
// frames), what they say when they cannot (tool missing, ptrace refused, process gone), the
// parsers, dttrainer's ring of collectives, and the verdict over a generation's captures.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/collective_ring.h"
#include "common/fs.h"
#include "common/process_tree.h"
#include "common/proto_time.h"
#include "common/stack_capture.h"
#include "coordinator/hang_verdict.h"
#include "tests/test_util.h"

namespace dt {
namespace {

const char* kPython = "/usr/bin/python3";

std::string HookDir() { return JoinPath(DT_BINARY_DIR, "../python/dt_site"); }

// A Python program that sleeps inside load_batch (one function down from main), with dt's hook.
std::unique_ptr<Subprocess> StartHookedPython(const std::string& stacks_dir, const std::string& log) {
  std::string program =
      "import threading, time\n"
      "def load_batch():\n"
      "    time.sleep(600)\n"
      "def helper():\n"
      "    time.sleep(600)\n"
      "threading.Thread(target=helper, daemon=True).start()\n"
      "print('ready', flush=True)\n"
      "load_batch()\n";
  std::string script = JoinPath(stacks_dir, "../prog.py");
  EXPECT_TRUE(WriteFileAtomic(script, program).ok());
  return std::make_unique<Subprocess>(
      std::vector<std::string>{kPython, script},
      std::map<std::string, std::string>{{"PYTHONPATH", HookDir()}, {"DT_STACKS_DIR", stacks_dir}}, log);
}

const v1::ThreadStack* MainThread(const v1::ProcessStacks& p) {
  for (const v1::ThreadStack& t : p.threads()) {
    if (t.main()) return &t;
  }
  return nullptr;
}

bool HasFunction(const v1::ThreadStack& t, absl::string_view name) {
  for (const v1::StackFrame& f : t.frames()) {
    if (absl::StrContains(f.function(), name)) return true;
  }
  return false;
}

TEST(StackCapture, PythonFramesOfEveryThreadComeFromTheInterpreter) {
  testing::TempDir tmp;
  std::string stacks = tmp.Sub("stacks");
  std::string log = JoinPath(tmp.path(), "py.log");
  std::unique_ptr<Subprocess> py = StartHookedPython(stacks, log);
  ASSERT_TRUE(testing::WaitFor([&] { return absl::StrContains(testing::Slurp(log), "ready"); }, absl::Seconds(30)))
      << testing::Slurp(log);
  StackCaptureOptions o;
  o.python_hooks_dir = stacks;
  std::vector<v1::ProcessStacks> got = CaptureProcessStacks({py->pid()}, o);
  ASSERT_EQ(got.size(), 1u);
  const v1::ProcessStacks& p = got[0];
  EXPECT_EQ(p.kind(), "python");
  EXPECT_EQ(p.error(), "") << p.DebugString();
  ASSERT_EQ(p.threads_size(), 2) << p.DebugString();
  const v1::ThreadStack* main = MainThread(p);
  ASSERT_NE(main, nullptr) << p.DebugString();
  // Innermost first: load_batch at its sleep's line, called from the module.
  ASSERT_GE(main->frames_size(), 2);
  EXPECT_EQ(main->frames(0).function(), "load_batch");
  EXPECT_EQ(main->frames(0).line(), 3);
  EXPECT_TRUE(absl::EndsWith(main->frames(0).file(), "prog.py")) << main->frames(0).file();
  EXPECT_EQ(main->frames(1).function(), "<module>");
  bool helper = false;
  for (const v1::ThreadStack& t : p.threads()) helper = helper || (!t.main() && HasFunction(t, "helper"));
  EXPECT_TRUE(helper) << p.DebugString();
  // The process lives on, unharmed: a second capture answers the same.
  EXPECT_TRUE(py->running());
  std::vector<v1::ProcessStacks> again = CaptureProcessStacks({py->pid()}, o);
  EXPECT_EQ(again[0].error(), "");
  EXPECT_EQ(again[0].threads_size(), 2);
}

// What the hook leaves a program: the sitecustomize it shadows (a user's, here) still runs; its
// hook file names the thread threading calls main; a child forked from another thread (which
// becomes the child's main thread) writes its own.
TEST(StackCapture, TheHookRunsTheNextSitecustomizeAndCoversForkedChildren) {
  testing::TempDir tmp;
  std::string stacks = tmp.Sub("stacks");
  std::string user_site = tmp.Sub("user_site");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(user_site, "sitecustomize.py"),
                              "import os\n"
                              "open(os.environ['USER_SITE_MARK'], 'w').write('ran')\n")
                  .ok());
  std::string mark = JoinPath(tmp.path(), "user_site_ran");
  std::string seen_file = JoinPath(tmp.path(), "seen");
  std::string program = JoinPath(tmp.path(), "prog.py");
  ASSERT_TRUE(WriteFileAtomic(program,
                              "import os, sys, threading\n"
                              "def record(who):\n"
                              "    with open(sys.argv[1], 'a') as f:\n"
                              "        f.write('%s %d %d\\n' % (who, os.getpid(), threading.main_thread().ident))\n"
                              "def fork():\n"
                              "    pid = os.fork()\n"
                              "    if pid == 0:\n"
                              "        record('child')\n"
                              "        os._exit(0)\n"
                              "    os.waitpid(pid, 0)\n"
                              "record('main')\n"
                              "t = threading.Thread(target=fork)\n"
                              "t.start()\n"
                              "t.join()\n")
                  .ok());
  std::string log = JoinPath(tmp.path(), "py.log");
  Subprocess py(
      {kPython, program, seen_file},
      {{"PYTHONPATH", absl::StrCat(HookDir(), ":", user_site)}, {"DT_STACKS_DIR", stacks}, {"USER_SITE_MARK", mark}},
      log);
  ASSERT_EQ(py.Wait(absl::Seconds(60)), 0) << testing::Slurp(log);
  EXPECT_EQ(testing::Slurp(mark), "ran") << testing::Slurp(log);
  std::vector<std::string> seen = absl::StrSplit(testing::Slurp(seen_file), '\n', absl::SkipEmpty());
  ASSERT_EQ(seen.size(), 2u) << testing::Slurp(seen_file) << testing::Slurp(log);
  for (const std::string& line : seen) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    ASSERT_EQ(f.size(), 3u) << line;
    std::string hook = testing::Slurp(JoinPath(stacks, absl::StrCat(f[1], ".hook")));
    EXPECT_TRUE(absl::StrContains(hook, absl::StrCat("pid=", f[1], "\n"))) << f[0] << ":\n" << hook;
    EXPECT_TRUE(absl::StrContains(hook, absl::StrCat("main_thread=", f[2], "\n"))) << f[0] << ":\n" << hook;
  }
}

TEST(StackCapture, NativeFramesWithFunctionNamesFromEuStack) {
  Subprocess sleeper({"/bin/sleep", "600"});
  ASSERT_TRUE(testing::WaitFor([&] { return ReadProcess(sleeper.pid()).has_value(); }, absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(100));  // past exec
  std::vector<v1::ProcessStacks> got = CaptureProcessStacks({sleeper.pid()}, StackCaptureOptions());
  const v1::ProcessStacks& p = got[0];
  EXPECT_EQ(p.kind(), "native");
  ASSERT_EQ(p.error(), "") << p.DebugString();
  ASSERT_EQ(p.threads_size(), 1);
  EXPECT_TRUE(p.threads(0).main());
  EXPECT_TRUE(HasFunction(p.threads(0), "nanosleep")) << p.DebugString();
  EXPECT_EQ(p.command(), "sleep");
  EXPECT_EQ(ReadProcess(sleeper.pid())->state, 'S');  // detached and left running, not stopped
}

TEST(StackCapture, AMissingToolIsNamedWithItsDebianPackage) {
  Subprocess sleeper({"/bin/sleep", "600"});
  ::setenv("DT_EU_STACK", "/nonexistent/eu-stack", 1);
  std::vector<v1::ProcessStacks> got = CaptureProcessStacks({sleeper.pid()}, StackCaptureOptions());
  ::unsetenv("DT_EU_STACK");
  EXPECT_NE(got[0].error().find("elfutils"), std::string::npos) << got[0].error();
  EXPECT_EQ(got[0].threads_size(), 0);
}

TEST(StackCapture, RefusedPtraceIsSaidWithWhatToAllow) {
  Subprocess sleeper({"/bin/sleep", "600"});
  absl::SleepFor(absl::Milliseconds(100));
  // Another tracer holds the process (as gdb or strace would): the kernel refuses a second one.
  pid_t target = sleeper.pid();
  pid_t tracer = ::fork();
  if (tracer == 0) {
    if (::ptrace(PTRACE_SEIZE, target, nullptr, nullptr) != 0) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return ReadFile(absl::StrCat("/proc/", target, "/status")).value_or("").find("TracerPid:\t0") ==
               std::string::npos;
      },
      absl::Seconds(5)));
  std::vector<v1::ProcessStacks> got = CaptureProcessStacks({target}, StackCaptureOptions());
  ::kill(tracer, SIGKILL);
  ::waitpid(tracer, nullptr, 0);
  EXPECT_NE(got[0].error().find("ptrace was refused"), std::string::npos) << got[0].error();
  EXPECT_NE(got[0].error().find("tracer"), std::string::npos) << got[0].error();
}

TEST(StackCapture, AProcessThatIsGoneIsSaidSo) {
  pid_t gone;
  {
    Subprocess quick({"/bin/true"});
    quick.Wait(absl::Seconds(5));
    gone = quick.pid();
  }
  std::vector<v1::ProcessStacks> got = CaptureProcessStacks({gone}, StackCaptureOptions());
  EXPECT_NE(got[0].error().find("ended"), std::string::npos) << got[0].error();
}

TEST(StackCapture, ParsesEuStackOutput) {
  std::string output =
      "PID 9032 - process\n"
      "TID 9032:\n"
      "#0  0x00007f9ad8ccd545 clock_nanosleep@GLIBC_2.2.5 - /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "    ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48:7\n"
      "#1  0x000055af196e2241 ns::HangHere(int) - /tmp/t\n"
      "    /tmp/t.cc:3:57\n"
      "#2  0x00000000005d64b4 - /usr/bin/python3.11\n"
      "TID 9033:\n"
      "#0  0x00007f9ad8ccd545 clock_nanosleep@GLIBC_2.2.5 - /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "eu-stack: tid 9033: shown max number of frames (1, use -n 0 for unlimited)\n";
  std::vector<v1::ThreadStack> t = ParseEuStack(output);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].tid(), 9032);
  ASSERT_EQ(t[0].frames_size(), 3);
  EXPECT_EQ(t[0].frames(1).function(), "ns::HangHere(int)");
  EXPECT_EQ(t[0].frames(1).module(), "/tmp/t");
  EXPECT_EQ(t[0].frames(1).file(), "/tmp/t.cc");
  EXPECT_EQ(t[0].frames(1).line(), 3);
  EXPECT_EQ(t[0].frames(2).function(), "??");
  EXPECT_EQ(t[0].frames(2).module(), "/usr/bin/python3.11");
  EXPECT_EQ(t[1].frames_size(), 1);
}

TEST(StackCapture, ParsesFaulthandlerDumps) {
  std::string dump =
      "Thread 0x00007f3c2a1fe700 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "\n"
      "Current thread 0x00007f3c2b5c0740 (most recent call first):\n"
      "  File \"/x/train.py\", line 12 in load_batch\n"
      "  File \"/x/train.py\", line 30 in <module>\n";
  std::vector<v1::ThreadStack> t = ParseFaulthandler(dump, 0x00007f3c2b5c0740);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_FALSE(t[0].main());
  EXPECT_TRUE(t[1].main());
  ASSERT_EQ(t[1].frames_size(), 2);
  EXPECT_EQ(t[1].frames(0).function(), "load_batch");
  EXPECT_EQ(t[1].frames(0).file(), "/x/train.py");
  EXPECT_EQ(t[1].frames(0).line(), 12);
}

TEST(CollectiveRing, KeepsTheNewestInOrderAndMarksTheOneWaitedFor) {
  CollectiveRing ring;
  for (int k = 0; k < 70; ++k) ring.End(ring.Begin("all-reduce", 8));
  uint64_t waiting = ring.Begin("broadcast", 64);
  std::vector<v1::CollectiveRecord> r = ring.Snapshot();
  ASSERT_EQ(r.size(), CollectiveRing::kCapacity);
  EXPECT_EQ(r.front().sequence(), 71 - static_cast<int64_t>(CollectiveRing::kCapacity) + 1);
  EXPECT_EQ(r.back().sequence(), static_cast<int64_t>(waiting));
  EXPECT_EQ(r.back().op(), "broadcast");
  EXPECT_FALSE(r.back().has_ended());
  EXPECT_TRUE(r[r.size() - 2].has_ended());
  ring.End(1);  // long gone: ignored
}

// Ranks whose capture's main stack is `frames` (Python frames: function@file:line).
v1::RankStacks PythonRank(int rank, std::vector<std::tuple<std::string, std::string, int>> frames) {
  v1::RankStacks r;
  r.set_rank(rank);
  v1::ProcessStacks* p = r.add_processes();
  p->set_kind("python");
  v1::ThreadStack* t = p->add_threads();
  t->set_main(true);
  for (auto& [fn, file, line] : frames) {
    v1::StackFrame* f = t->add_frames();
    f->set_function(fn);
    f->set_file(file);
    f->set_line(line);
  }
  return r;
}

TEST(HangVerdict, TheRankNotInTheCollectiveIsTheOddOne) {
  std::vector<v1::RankStacks> ranks = {
      PythonRank(0, {{"all_reduce", "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 1536},
                     {"main", "/x/train.py", 20}}),
      PythonRank(1, {{"load_batch", "/x/train.py", 9}, {"main", "/x/train.py", 19}}),
      PythonRank(2, {{"all_reduce", "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 1536},
                     {"main", "/x/train.py", 20}}),
  };
  v1::HangVerdict v = JudgeHang(ranks, 4, absl::Now());
  ASSERT_EQ(v.groups_size(), 2);
  EXPECT_EQ(v.groups(0).ranks_size(), 2);
  EXPECT_FALSE(v.groups(0).odd());
  EXPECT_TRUE(v.groups(1).odd());
  ASSERT_EQ(v.odd_ranks_size(), 1);
  EXPECT_EQ(v.odd_ranks(0), 1);
  EXPECT_NE(v.summary().find("rank 1 in load_batch (train.py:9) is the odd one out"), std::string::npos) << v.summary();
  EXPECT_NE(v.summary().find("ranks 0, 2 in all_reduce"), std::string::npos) << v.summary();
  EXPECT_NE(v.summary().find("No stacks from rank 3"), std::string::npos) << v.summary();
  ASSERT_EQ(v.missing_ranks_size(), 1);
  EXPECT_EQ(v.odd_signature(), StackSignature(ranks[1].processes(0).threads(0)));
}

TEST(HangVerdict, TheRingsNameTheCollectiveAndWhoIsBehind) {
  absl::Time now = absl::Now();
  auto with_ring = [&](int rank, int finished, bool waiting) {
    v1::RankStacks r = PythonRank(rank, {{waiting ? "wait" : "HangInsideStepForTests", "", 0}});
    for (int s = 1; s <= finished; ++s) {
      v1::CollectiveRecord* c = r.add_collectives();
      c->set_sequence(s);
      c->set_op("all-reduce");
      *c->mutable_started() = ToProtoTime(now - absl::Seconds(60));
      *c->mutable_ended() = ToProtoTime(now - absl::Seconds(59));
    }
    if (waiting) {
      v1::CollectiveRecord* c = r.add_collectives();
      c->set_sequence(finished + 1);
      c->set_op("all-reduce");
      *c->mutable_started() = ToProtoTime(now - absl::Seconds(41));
    }
    return r;
  };
  std::vector<v1::RankStacks> ranks;
  for (int r = 0; r < 7; ++r) ranks.push_back(with_ring(r, 1041, true));
  ranks.push_back(with_ring(7, 1041, false));
  v1::HangVerdict v = JudgeHang(ranks, 8, now);
  EXPECT_EQ(v.collectives(), "ranks 0-6 wait in all-reduce #1042 (started 41s ago); rank 7 last finished #1041");
  ASSERT_EQ(v.odd_ranks_size(), 1);
  EXPECT_EQ(v.odd_ranks(0), 7);
}

TEST(HangVerdict, IdenticalStacksNameNoOddOne) {
  std::vector<v1::RankStacks> ranks = {PythonRank(0, {{"f", "/a.py", 1}}), PythonRank(1, {{"f", "/a.py", 1}})};
  v1::HangVerdict v = JudgeHang(ranks, 2, absl::Now());
  ASSERT_EQ(v.groups_size(), 1);
  EXPECT_EQ(v.odd_ranks_size(), 0);
  EXPECT_EQ(v.odd_signature(), "");
  EXPECT_NE(v.summary().find("same stack"), std::string::npos) << v.summary();
  EXPECT_EQ(RankList({7, 0, 1, 2, 5}), "0-2, 5, 7");
}

}  // namespace
}  // namespace dt
