// Supervision end to end, with real processes: a hang's stacks captured on every rank before its
// generation is stopped (dttrainer with a test-only hook; a Python script that never imports dt),
// the verdict naming the odd rank, a hang that repeats ending the run, live captures that leave
// training untouched, every process of a rank ended with it (kill -9 of dtrun, a cancel, a wrapper
// shell and a grandchild that ignores SIGTERM), and failure reports that survive whatever a
// program prints. dtcoord, dtctl's local launcher, dtrun, dtslot, dttrainer, Debian's python3.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/process_tree.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;

const char* kPython = "/usr/bin/python3";

std::string TestScript(const std::string& name) { return JoinPath(DT_SOURCE_DIR, "tests/python/" + name); }

// Whether any frame of the group's stack names `function`.
bool GroupHas(const nlohmann::json& group, const std::string& function) {
  for (const auto& f : group["frames"]) {
    if (absl::StrContains(f.value("function", ""), function)) return true;
  }
  return false;
}

const nlohmann::json* OddGroup(const nlohmann::json& verdict) {
  for (const auto& g : verdict["groups"]) {
    if (g.value("odd", false)) return &g;
  }
  return nullptr;
}

class HangE2ETest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  // A group whose step has not moved for 5 s is hung; ranks heartbeat five times a second.
  CoordinatorProcess coord_{tmp_.path(),
                            {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s", "--hang-timeout", "5s",
                             "--rendezvous-timeout", "1m"}};

  CommandResult Dtctl(const std::vector<std::string>& args, std::map<std::string, std::string> env = {}) {
    env["HOME"] = tmp_.path();
    return testing::RunDtctl(coord_, args, env);
  }
  nlohmann::json Status(const std::string& run) { return testing::DtctlJson(Dtctl({"status", run, "-o", "json"})); }

  // dtctl submit (local, one node × 2) → run id. `before`: submit flags; `after`: the words after --.
  std::string Submit(const std::string& name, std::vector<std::string> before, const std::vector<std::string>& after,
                     const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> args = {"submit",           "-o", "json", "--name", name, "--save-dir", save_dir_,
                                     "--nproc-per-node", "2"};
    args.insert(args.end(), before.begin(), before.end());
    args.push_back("--");
    args.insert(args.end(), after.begin(), after.end());
    CommandResult r = Dtctl(args, env);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::DtctlJson(r).value("run_id", "");
  }

  std::vector<std::string> TinyTrainer(int steps) {
    return {"--dataset",    JoinPath(testing::DataDir(), "alpaca_sample.json"),
            "--model",      "tiny",
            "--seq-len",    "64",
            "--batch-size", "2",
            "--max-steps",  absl::StrCat(steps),
            "--ckpt-freq",  "0",
            "--eval-split", "0",
            "--log-freq",   "1",
            "--seed",       "5",
            "--dropout",    "0"};
  }

  std::string Logs(const std::string& name) {
    std::string out;
    std::string dir = JoinPath(JoinPath(save_dir_, name), "logs");
    for (const char* f : {"launcher.log", "rank-0.log", "rank-1.log"}) {
      absl::StrAppend(&out, "--- ", f, "\n", testing::Slurp(JoinPath(dir, f)));
    }
    return out;
  }

  // Until the run has no process left anywhere (by its slot markers), at most `limit`.
  bool AwaitNoProcessOf(const std::string& run, absl::Duration limit) {
    return testing::WaitFor([&] { return ProcessesWithMarker(MarkerOfRun(run)).empty(); }, limit);
  }
};

// dttrainer, 2 local ranks; rank 1 blocks at the start of step 3 inside a test-only hook. The
// coordinator's step watchdog fires, every rank's stacks are captured while every process lives,
// the verdict names rank 1 (it never reached the all-reduce rank 0 waits in), and the generation
// restarts. The restarted generation hangs the same way: the run ends HUNG_REPEATEDLY after one
// restart instead of spending its budget of three.
TEST_F(HangE2ETest, AHungTrainerIsCapturedAndTheSameHangTwiceEndsTheRun) {
  std::string run = Submit("hook", {"--max-restarts", "3"}, TinyTrainer(50),
                           {{"DT_TEST_HANG_AT_STEP", "3"}, {"DT_TEST_HANG_RANK", "1"}});
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_NE(watch.exit_code, 0);
  nlohmann::json s = Status(run);
  ASSERT_EQ(s["state"], "FAILED") << s.dump(2) << Logs("hook");
  EXPECT_EQ(s["restarts"], 1) << s.dump(2);
  EXPECT_EQ(s["reason"]["kind"], "HUNG_REPEATEDLY") << s.dump(2);
  EXPECT_NE(s["reason"]["message"].get<std::string>().find("hung the way generation 0 did"), std::string::npos);

  const nlohmann::json& first = s["failures"][0];
  ASSERT_EQ(first["kind"], "HANG") << first.dump(2);
  ASSERT_TRUE(first.contains("verdict")) << first.dump(2);
  const nlohmann::json& verdict = first["verdict"];
  EXPECT_EQ(verdict["odd_ranks"], nlohmann::json::array({1})) << verdict.dump(2);
  EXPECT_EQ(first["rank"], 1);
  const nlohmann::json* odd = OddGroup(verdict);
  ASSERT_NE(odd, nullptr) << verdict.dump(2);
  EXPECT_TRUE(GroupHas(*odd, "HangInsideStepForTests")) << odd->dump(2);
  // Rank 0 waits in the step's gradient all-reduce; the rings say which one.
  for (const auto& g : verdict["groups"]) {
    if (!g.value("odd", false)) {
      EXPECT_TRUE(GroupHas(g, "wait")) << g.dump(2);
    }
  }
  std::string collectives = verdict["collectives"];
  EXPECT_TRUE(absl::StrContains(collectives, "rank 0 waits in all-reduce #")) << collectives;
  EXPECT_TRUE(absl::StrContains(collectives, "rank 1 last finished #")) << collectives;

  // The whole capture: every process of both ranks answered with its threads (it was alive).
  CommandResult stacks = Dtctl({"stacks", run, "--generation", "0", "-o", "json"});
  ASSERT_EQ(stacks.exit_code, 0) << stacks.output;
  nlohmann::json captures = testing::DtctlJson(stacks);
  ASSERT_EQ(captures.size(), 1u) << stacks.output;
  ASSERT_EQ(captures[0]["ranks"].size(), 2u);
  for (const auto& rank : captures[0]["ranks"]) {
    for (const auto& p : rank["processes"]) {
      EXPECT_EQ(p.value("error", ""), "") << p.dump(2);
      EXPECT_GE(p["threads"].size(), 2u);
    }
    EXPECT_FALSE(rank["collectives"].empty());
  }
  // People read it in dtctl status and in the experiment directory.
  CommandResult text = Dtctl({"status", run});
  EXPECT_TRUE(absl::StrContains(text.output, "odd one out: rank 1")) << text.output;
  EXPECT_TRUE(absl::StrContains(text.output, "HangInsideStepForTests")) << text.output;
  std::string hangs = JoinPath(JoinPath(save_dir_, "hook"), "hangs/gen-0");
  EXPECT_TRUE(absl::StrContains(testing::Slurp(JoinPath(hangs, "verdict.txt")), "odd group: rank 1"));
  EXPECT_TRUE(absl::StrContains(testing::Slurp(JoinPath(hangs, "rank-1.txt")), "HangInsideStepForTests"));
  EXPECT_TRUE(AwaitNoProcessOf(run, absl::Seconds(15)));
}

// The line of hang_in_load_batch.py where rank 1 sleeps.
int SleepLine() {
  std::istringstream in(testing::Slurp(TestScript("hang_in_load_batch.py")));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (absl::StrContains(line, "time.sleep(3600)")) return n;
  }
  return -1;
}

// A plain torchrun-style script (never imports dt): rank 1 sleeps in load_batch before the
// all_reduce rank 0 waits in. Both go idle; --idle-timeout 3s declares the hang; the verdict shows
// load_batch with its file and line for rank 1 and the all_reduce for rank 0.
TEST_F(HangE2ETest, AHungPythonScriptNamesLoadBatchForRank1AndTheAllReduceForRank0) {
  std::string run =
      Submit("pyhang", {"--idle-timeout", "3s", "--exec"}, {kPython, TestScript("hang_in_load_batch.py")});
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_NE(watch.exit_code, 0);
  nlohmann::json s = Status(run);
  ASSERT_EQ(s["state"], "FAILED") << s.dump(2) << Logs("pyhang");
  ASSERT_EQ(s["reason"]["kind"], "HANG") << s.dump(2);
  EXPECT_TRUE(absl::StrContains(s["reason"]["message"].get<std::string>(), "--idle-timeout")) << s["reason"];
  const nlohmann::json& verdict = s["reason"]["verdict"];
  EXPECT_EQ(verdict["odd_ranks"], nlohmann::json::array({1})) << verdict.dump(2);
  const nlohmann::json* odd = OddGroup(verdict);
  ASSERT_NE(odd, nullptr) << verdict.dump(2);
  const nlohmann::json& top = (*odd)["frames"][0];
  EXPECT_EQ(top["function"], "load_batch") << odd->dump(2);
  EXPECT_TRUE(absl::EndsWith(top["file"].get<std::string>(), "hang_in_load_batch.py")) << top;
  EXPECT_EQ(top["line"], SleepLine()) << top;
  for (const auto& g : verdict["groups"]) {
    if (!g.value("odd", false)) {
      EXPECT_TRUE(GroupHas(g, "all_reduce")) << g.dump(2);
    }
  }
  CommandResult text = Dtctl({"status", run});
  EXPECT_TRUE(absl::StrContains(text.output, "load_batch (")) << text.output;
  EXPECT_TRUE(absl::StrContains(text.output, absl::StrCat("hang_in_load_batch.py:", SleepLine()))) << text.output;
  EXPECT_TRUE(AwaitNoProcessOf(run, absl::Seconds(15)));
}

// One line of writer.py: the generation that wrote it and when.
struct Written {
  int generation;
  double time;
};
std::vector<Written> ReadWrites(const std::string& path) {
  std::vector<Written> out;
  std::istringstream in(testing::Slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    Written w;
    if (f.size() == 3 && absl::SimpleAtoi(f[0], &w.generation) && absl::SimpleAtod(f[1], &w.time)) out.push_back(w);
  }
  return out;
}

// The user's program behind a wrapper shell, which also starts a grandchild that ignores SIGTERM.
// A live capture shows every process (the shell without native frames here, since the capture tool
// is hidden: the reason names its Debian package). kill -9 of dtrun: no process of that generation
// outlives the grace, and the next generation is the only one writing. A cancel leaves nothing.
TEST_F(HangE2ETest, KillingDtrunOrCancellingLeavesNoProcessOfTheRun) {
  std::string out = JoinPath(tmp_.path(), "writes.txt");
  std::string wrapper =
      absl::StrCat("(trap '' TERM; exec sleep 600) & ", kPython, " ", TestScript("writer.py"), " ", out, "; wait");
  std::string run = Submit("tree", {"--max-restarts", "1", "--idle-timeout", "0", "--exec"},
                           {"/bin/bash", "-c", wrapper}, {{"DT_EU_STACK", "/nonexistent/eu-stack"}});
  ASSERT_TRUE(testing::WaitFor([&] { return ReadWrites(out).size() >= 10; }, absl::Seconds(60))) << Logs("tree");

  CommandResult live = Dtctl({"stacks", run, "-o", "json"});
  ASSERT_EQ(live.exit_code, 0) << live.output;
  nlohmann::json captures = testing::DtctlJson(live);
  ASSERT_EQ(captures.size(), 1u) << live.output;
  EXPECT_TRUE(captures[0].value("live", false));
  bool python_frames = false, tool_named = false;
  for (const auto& rank : captures[0]["ranks"]) {
    EXPECT_EQ(rank["processes"].size(), 3u) << rank.dump(2);  // bash, python, sleep
    for (const auto& p : rank["processes"]) {
      if (p.value("kind", "") == "python") {
        for (const auto& t : p["threads"]) {
          for (const auto& f : t["frames"]) python_frames = python_frames || f.value("function", "") == "write_batches";
        }
      } else {
        tool_named = tool_named || absl::StrContains(p.value("error", ""), "elfutils");
      }
    }
  }
  EXPECT_TRUE(python_frames) << live.output;
  EXPECT_TRUE(tool_named) << live.output;
  EXPECT_EQ(Status(run)["state"], "RUNNING");  // the capture stopped nothing

  // kill -9 of the node's dtrun.
  std::vector<pid_t> generation0 = ProcessesWithMarker(MarkerBeforeGeneration(run, 1));
  pid_t dtrun = 0;
  for (pid_t p : generation0) {
    if (std::optional<ProcessInfo> info = ReadProcess(p); info && info->comm == "dtrun") dtrun = p;
  }
  ASSERT_NE(dtrun, 0) << "no dtrun among " << generation0.size() << " processes";
  EXPECT_GE(generation0.size(), 9u);  // dtrun, 2 × (dtslot, bash, python, sleep)
  ASSERT_EQ(::kill(dtrun, SIGKILL), 0);
  absl::Time killed = absl::Now();
  // dtrun's grace (10 s) for the grandchild that ignores SIGTERM, and a margin.
  EXPECT_TRUE(
      testing::WaitFor([&] { return ProcessesWithMarker(MarkerBeforeGeneration(run, 1)).empty(); }, absl::Seconds(15)))
      << "generation 0 outlived its dtrun by more than the grace";
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::vector<Written> w = ReadWrites(out);
        return std::count_if(w.begin(), w.end(), [](const Written& x) { return x.generation == 1; }) >= 5;
      },
      absl::Seconds(60)))
      << Logs("tree");
  double last0 = 0, first1 = 1e18;
  for (const Written& w : ReadWrites(out)) {
    if (w.generation == 0) last0 = std::max(last0, w.time);
    if (w.generation == 1) first1 = std::min(first1, w.time);
  }
  EXPECT_LT(last0, first1) << "generation 0 still wrote after generation 1 began";
  EXPECT_LT(last0, absl::ToDoubleSeconds(killed - absl::UnixEpoch()) + 1.0);

  ASSERT_EQ(Dtctl({"cancel", run}).exit_code, 0);
  EXPECT_TRUE(AwaitNoProcessOf(run, absl::Seconds(20)))
      << ProcessesWithMarker(MarkerOfRun(run)).size() << " process(es) of the run left after the cancel";
  EXPECT_EQ(Status(run)["state"], "CANCELLED");
}

// What a failing program leaves can be anything: a 1 MB or 100 MB error file, bytes that are not
// UTF-8. The rank and the exception are named at once (not after a heartbeat timeout), and dtrun
// reports instead of crashing.
TEST_F(HangE2ETest, FailureReportsSurviveHugeErrorFilesAndInvalidUtf8) {
  struct Case {
    std::string name;
    std::vector<std::string> args;
  };
  for (const Case& c : std::vector<Case>{{"err-1mb", {"huge-error-file", "1000000"}},
                                         {"err-100mb", {"huge-error-file", "100000000"}},
                                         {"bad-utf8", {"invalid-utf8"}}}) {
    std::vector<std::string> command = {kPython, TestScript("fail_with.py")};
    command.insert(command.end(), c.args.begin(), c.args.end());
    std::string run = Submit(c.name, {"--exec"}, command);
    CommandResult watch = Dtctl({"watch", run});
    EXPECT_NE(watch.exit_code, 0);
    nlohmann::json s = Status(run);
    ASSERT_EQ(s["state"], "FAILED") << c.name << s.dump(2);
    const nlohmann::json& reason = s["reason"];
    EXPECT_NE(reason["kind"], "HEARTBEAT_TIMEOUT") << c.name << reason.dump(2);
    EXPECT_EQ(reason["rank"], 1) << c.name << reason.dump(2);
    EXPECT_EQ(reason["exception_type"], "ValueError") << c.name << reason.dump(2);
    std::string message = reason["message"];
    if (c.args[0] == "huge-error-file") {
      EXPECT_EQ(message.rfind("START", 0), 0u) << c.name << message.substr(0, 200);
      EXPECT_TRUE(absl::StrContains(message, "END")) << c.name;
      EXPECT_LT(message.size(), 64u << 10) << c.name;
    } else {
      EXPECT_TRUE(absl::StrContains(message, "bad bytes")) << message;
    }
    std::string dtrun_log = testing::Slurp(JoinPath(JoinPath(save_dir_, c.name), "logs/dtrun-" + NodeName() + ".log"));
    EXPECT_TRUE(absl::StrContains(dtrun_log, "rank 1 failed: ValueError")) << c.name << dtrun_log;
    EXPECT_FALSE(absl::StrContains(testing::Slurp(JoinPath(JoinPath(save_dir_, c.name), "logs/launcher.log")),
                                   "killed by signal"))
        << c.name;
  }
}

// A program that cannot start (its python lacks a module) fails the same way before its first step
// in two generations in a row: the run ends then, saying so, with four of its five restarts left.
TEST_F(HangE2ETest, TheSameExceptionBeforeTheFirstStepTwiceEndsTheRun) {
  std::string run = Submit("nomodule", {"--max-restarts", "5", "--exec"}, {kPython, "-c", "import no_such_module_dt"});
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_NE(watch.exit_code, 0);
  nlohmann::json s = Status(run);
  ASSERT_EQ(s["state"], "FAILED") << s.dump(2);
  EXPECT_EQ(s["restarts"], 1) << s.dump(2);
  EXPECT_EQ(s["reason"]["exception_type"], "ModuleNotFoundError") << s["reason"];
  EXPECT_TRUE(absl::StrContains(s["reason"]["message"].get<std::string>(), "before its first step too")) << s["reason"];
}

// dtctl stacks on a healthy dttrainer run captures while it trains, and the run's losses are those
// of the same run without captures, bit for bit. A run token reads only its own run's stacks; an
// ended run without a hang has none stored, and says so.
TEST_F(HangE2ETest, LiveCapturesLeaveTheLossesUnchanged) {
  std::string plain = Submit("plain", {}, TinyTrainer(25));
  ASSERT_EQ(Dtctl({"watch", plain}).exit_code, 0) << Logs("plain");
  std::string watched = Submit("watched", {}, TinyTrainer(25));
  int captured = 0;
  while (Status(watched)["state"] != "SUCCEEDED" && captured < 20) {
    nlohmann::json s = Status(watched);
    if (s["state"] != "RUNNING" || s["step"].get<int>() < 1) {
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    CommandResult r = Dtctl({"stacks", watched, "-o", "json"});
    if (r.exit_code != 0) break;  // the run ended meanwhile
    nlohmann::json c = testing::DtctlJson(r);
    // The run ended between the status and the capture: dtctl showed the kept captures instead.
    if (c.size() != 1 || !c[0].value("live", false)) break;
    if (c[0]["ranks"].size() == 2u) {
      ++captured;
    } else {  // a rank finished its last step meanwhile: the capture says so
      EXPECT_TRUE(absl::StrContains(c[0].value("reason", ""), "left before answering")) << r.output;
    }
  }
  EXPECT_GE(captured, 2) << "the run ended before two captures of both ranks";
  ASSERT_EQ(Dtctl({"watch", watched}).exit_code, 0) << Logs("watched");
  std::vector<v1::MetricRecord> a = coord_.Metrics(plain, "loss", 0), b = coord_.Metrics(watched, "loss", 0);
  ASSERT_EQ(a.size(), 25u);
  ASSERT_EQ(b.size(), 25u);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].value(), b[k].value()) << "step " << a[k].step();

  CommandResult none = Dtctl({"stacks", plain});
  EXPECT_EQ(none.exit_code, 0) << none.output;
  EXPECT_TRUE(absl::StrContains(none.output, "has no stored stack captures")) << none.output;
  // Another run's token.
  CommandResult other =
      Dtctl({"stacks", plain}, {{"DT_TOKEN", coord_.Submit(testing::MakeSpec("x", save_dir_, 1, 1)).run_token()}});
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_TRUE(absl::StrContains(other.output, "may not touch run " + plain)) << other.output;
}

}  // namespace
}  // namespace dt
