// dtctl's contract: JSON shapes, exit codes (0 ok, 1 failed, 2 usage, 3 unreachable), errors for
// unknown runs, bad flags, bad tokens and failed pre-flight checks; and the local launcher end to
// end: success, kill -9 → relaunch and resume, no restart budget → FAILED with the root cause,
// cancel.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/subprocess.h"
#include "tests/loss_check.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;
using testing::Subprocess;

class DtctlTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  CoordinatorProcess coord_{
      tmp_.path(), {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--rendezvous-timeout", "1m"}};

  CommandResult Dtctl(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    env.try_emplace("HOME", tmp_.path());
    return testing::RunDtctl(coord_, args, env);
  }

  nlohmann::json Json(const CommandResult& r) {
    nlohmann::json j = testing::DtctlJson(r);
    EXPECT_FALSE(j.is_discarded()) << r.output;
    return j;
  }

  std::vector<std::string> TrainerArgs(int steps, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"--"};
    for (std::string& arg : testing::TinyModelArgs()) a.push_back(std::move(arg));
    a.insert(a.end(), {"--batch-size", "2", "--max-steps", std::to_string(steps), "--eval-split", "0"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // `dtctl submit ... -o json` → run id.
  std::string Submit(const std::string& name, int procs, int max_restarts, std::vector<std::string> trainer_args) {
    std::vector<std::string> args = {"submit",
                                     "-o",
                                     "json",
                                     "--name",
                                     name,
                                     "--save-dir",
                                     save_dir_,
                                     "--nproc-per-node",
                                     std::to_string(procs),
                                     "--max-restarts",
                                     std::to_string(max_restarts),
                                     "--omp-threads",
                                     "1"};
    args.insert(args.end(), trainer_args.begin(), trainer_args.end());
    CommandResult r = Dtctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return Json(r).value("run_id", "");
  }

  nlohmann::json Status(const std::string& run) { return Json(Dtctl({"status", run, "-o", "json"})); }
};

TEST_F(DtctlTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Dtctl({}).exit_code, 2);
  EXPECT_EQ(Dtctl({"status"}).exit_code, 2);
  EXPECT_EQ(Dtctl({"list", "--bogus"}).exit_code, 2);
  CommandResult r = Dtctl({"submit", "--name", "x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--save-dir"), std::string::npos) << r.output;
  r = Dtctl({"list", "-o", "yaml"});
  EXPECT_EQ(r.exit_code, 2);
  r = Dtctl({"submit", "--name", "bad/name", "--save-dir", save_dir_, "--", "--dataset", "x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("'/'"), std::string::npos) << r.output;
  // Numeric flags say the allowed values in words, not the validator's range to 1.8e308.
  for (const auto& [flag, value, range] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--max-restarts", "-2", "0..1000"}, {"--max-restarts", "5000", "0..1000"}}) {
    r = Dtctl({"submit", "--name", "x", "--save-dir", save_dir_, flag, value, "--", "--dataset", "x"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    std::string want = absl::StrCat(flag, ": must be in ", range, ", got ", value);
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("179769"), std::string::npos) << r.output;
  }
  // --nodes takes a count or MIN:MAX (an elastic run), and says so.
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"-1", "--nodes: \"-1\" is not a node count in 1..131072 or MIN:MAX"},
           {"3:2", "--nodes: MIN:MAX 3:2 needs MIN below MAX"},
           {"2:2", "for a fixed size give one count, e.g. --nodes 2"},
           {"0:2", "is not MIN:MAX with two node counts in 1..131072"},
           {"2:x", "is not MIN:MAX with two node counts in 1..131072"}}) {
    r = Dtctl({"submit", "--name", "x", "--save-dir", save_dir_, "--nodes", value, "--", "--dataset", "x"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << value << ": " << r.output;
  }
  // --nproc-per-node also takes torchrun's gpu, cpu and auto: the message lists them.
  r = Dtctl({"submit", "--name", "x", "--save-dir", save_dir_, "--nproc-per-node", "0", "--", "--dataset", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc-per-node: \"0\" is not a count within 1..131072, gpu (one per visible GPU), cpu"),
            std::string::npos)
      << r.output;
}

// What a new user gets wrong, answered with what was wrong and what to do (and nothing launched).
TEST_F(DtctlTest, UsageMessagesNameTheCauseAndTheFix) {
  std::string dir = tmp_.Sub("runfiles");
  auto file = [&](const std::string& name, const std::string& text) {
    std::string path = JoinPath(dir, name);
    EXPECT_TRUE(WriteFileAtomic(path, text).ok());
    return path;
  };
  std::string base = "name: x\nsave_dir: " + save_dir_ + "\n";
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"frobnicate"}, "unknown command \"frobnicate\" (commands: submit, list, status"},
      {{"status"}, "needs a run id"},
      {{"logs", "r-0000000000000000", "--rank", "abc"}, "--rank: must be a whole number, got \"abc\""},
      {{"list", "--coordinator"}, "--coordinator needs a value"},
      {{"--coordinator", "127.0.0.1:99999", "list"}, "the port must be a number in 1..65535"},
      {{"--coordinator", "http://host:1", "list"}, "drop the scheme"},
      {{"list", "--bogus"}, "unknown argument --bogus"},
      {{"submit", "--name", "x", "--save-dir", save_dir_, "--dataset", "d.json"},
       "--dataset is a trainer argument: put it after --"},
      {{"submit", "--name", "x", "--save-dir", save_dir_, "--", "--dataset", "d.json", "--dry-run"},
       "--dry-run comes after --, so it would go to dttrainer"},
      {{"submit", "--name", "x"}, "--save-dir is required"},
      {{"submit", "-f", dir}, "is not a regular file; give a YAML file"},
      {{"submit", "-f", JoinPath(dir, "missing.yaml")}, "No such file or directory"},
      {{"submit", "-f", file("a.yaml", base + "nodes: two\n")},
       "line 3: nodes \"two\" is not a node count in 1..131072 or MIN:MAX"},
      {{"submit", "-f", file("a2.yaml", base + "nodes: 3:3\nscheduler: slurm\n")},
       "line 3: nodes MIN:MAX 3:3 needs MIN below MAX"},
      // An elastic run's global batch must divide at every world size it may run at.
      {{"submit", "--name", "x", "--save-dir", save_dir_, "--nodes", "2:3", "--", "--dataset", "d.json", "--batch-size",
        "2", "--global-batch-size", "8"},
       "--global-batch-size 8 does not divide at 3 node(s) of --nodes 2:3: --batch-size 2 x 3 rank(s) = 6"},
      {{"submit", "-f", file("b.yaml", base + "trainer_args: --dataset foo\n")}, "trainer_args must be a list"},
      {{"submit", "-f", file("c.yaml", base + "wandb: p\n")}, "wandb must be a mapping"},
      {{"submit", "-f", file("d.yaml", base + "wandb: {projekt: p}\n")}, "wandb has an unknown field \"projekt\""},
      {{"submit", "-f", file("e.yaml", base + "max_restarts: -5\n")}, "max_restarts must be in 0..1000, got -5"},
  };
  for (const Case& c : cases) {
    CommandResult r = Dtctl(c.args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(c.args, " ") << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << absl::StrJoin(c.args, " ") << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(JoinPath(save_dir_, "x")));  // nothing was created or launched
}

TEST_F(DtctlTest, UnreachableCoordinatorExitsThree) {
  CommandResult r = Dtctl({"--coordinator", "127.0.0.1:1", "list"});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("127.0.0.1:1"), std::string::npos) << r.output;
}

TEST_F(DtctlTest, TokensAreFoundOrTheErrorSaysWhere) {
  CommandResult none = Dtctl({"list"}, {{"DT_TOKEN", ""}});
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("DT_TOKEN"), std::string::npos) << none.output;
  CommandResult wrong = Dtctl({"list"}, {{"DT_TOKEN", "dt_admin_wrong-wrong-wrong-wrong-wrong-wrong"}});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_NE(wrong.output.find("unknown token"), std::string::npos) << wrong.output;
  // The token file flag works.
  std::string file = JoinPath(tmp_.path(), "token");
  ASSERT_TRUE(WriteFileAtomic(file, coord_.admin_token() + "\n", 0600).ok());
  EXPECT_EQ(Dtctl({"--token-file", file, "list"}, {{"DT_TOKEN", ""}}).exit_code, 0);
  // A readable but empty token file is named as such.
  CommandResult empty = Dtctl({"--token-file", "/dev/null", "list"}, {{"DT_TOKEN", ""}});
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_NE(empty.output.find("token file /dev/null is empty"), std::string::npos) << empty.output;
}

TEST_F(DtctlTest, UnknownRunsFailWithTheReason) {
  CommandResult r = Dtctl({"status", "r-00000000000000aa"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  r = Dtctl({"cancel", "not-a-run"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("run id"), std::string::npos) << r.output;
  for (const char* cmd : {"watch", "checkpoints", "metrics", "logs"}) {
    EXPECT_EQ(Dtctl({cmd, "r-00000000000000aa"}).exit_code, 1) << cmd;
  }
}

TEST_F(DtctlTest, PreflightCatchesWhatWouldFailInTheQueue) {
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"submit", "--name", "pre", "--save-dir", save_dir_};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CommandResult r =
      Dtctl(args({"--", "--dataset", "/nope/data.json", "--tokenizer-dir", JoinPath(testing::DataDir(), "gpt2")}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nope/data.json"), std::string::npos) << r.output;
  r = Dtctl(args({"--", "--dataset", JoinPath(testing::DataDir(), "alpaca_sample.json"), "--tokenizer-dir", "/nope"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("encoder.json"), std::string::npos) << r.output;
  std::vector<std::string> good = TrainerArgs(1);
  std::vector<std::string> bad_trainer = {"--trainer", "/bin/false"};
  bad_trainer.insert(bad_trainer.end(), good.begin(), good.end());
  r = Dtctl(args(bad_trainer));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("does not run"), std::string::npos) << r.output;
  r = Dtctl(args({"--save-dir", "/proc/no-such-dir"}));
  EXPECT_NE(r.exit_code, 0);
  // Nothing was submitted by any of these.
  EXPECT_TRUE(Json(Dtctl({"list", "-o", "json"})).empty());
}

// A run that seems stuck: status says at which barrier it waits and for which ranks.
TEST_F(DtctlTest, StatusShowsTheBarrierARunWaitsAtAndForWhom) {
  v1::SubmitRunResponse run = coord_.Submit(testing::MakeSpec("stuck", save_dir_, 1, 3));
  auto agents = testing::RegisterAgents(coord_.Client(run.run_token()), run.run_id(), "n1", 3);
  std::vector<std::thread> waiting;
  std::vector<absl::Status> results(3);
  for (int r = 0; r < 2; ++r) {
    waiting.emplace_back([&, r] { results[r] = agents[r]->Barrier("epoch-end", absl::Seconds(60)); });
  }
  std::string shown;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        shown = Dtctl({"status", run.run_id()}).output;
        return shown.find("2 of 3 arrived") != std::string::npos;
      },
      absl::Seconds(10)))
      << shown;
  EXPECT_NE(shown.find("barrier    epoch-end (instance 1): 2 of 3 arrived"), std::string::npos) << shown;
  EXPECT_NE(shown.find("waiting for rank 2\n"), std::string::npos) << shown;
  results[2] = agents[2]->Barrier("epoch-end", absl::Seconds(60));
  for (auto& t : waiting) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Dtctl({"status", run.run_id()}).output.find("epoch-end"), std::string::npos) << "released: no longer shown";
}

TEST_F(DtctlTest, LocalRunEndToEndWithEveryCommandsShape) {
  std::string run = Submit("shapes", 2, 0, TrainerArgs(6, {"--ckpt-freq", "3"}));
  ASSERT_FALSE(run.empty());
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_NE(watch.output.find("SUCCEEDED"), std::string::npos);
  EXPECT_NE(watch.output.find("step 6/6"), std::string::npos) << watch.output;

  nlohmann::json list = Json(Dtctl({"list", "-o", "json"}));
  ASSERT_EQ(list.size(), 1u);
  nlohmann::json s = Status(run);
  for (const char* key : {"run_id", "name", "state", "world_size", "generation", "restarts", "step", "exp_dir",
                          "latest_checkpoint_step", "reason", "created_at", "ended_at", "ranks"}) {
    EXPECT_TRUE(s.contains(key)) << key;
    EXPECT_TRUE(list[0].contains(key)) << key;
  }
  EXPECT_EQ(s["state"], "SUCCEEDED");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["step"], 6);
  EXPECT_EQ(s["latest_checkpoint_step"], 6);
  EXPECT_TRUE(s["reason"].is_null());
  ASSERT_EQ(s["ranks"].size(), 2u);
  for (const char* key : {"rank", "local_rank", "node", "host", "pid", "state", "step"}) {
    EXPECT_TRUE(s["ranks"][0].contains(key)) << key;
  }
  EXPECT_EQ(s["ranks"][1]["state"], "FINISHED");

  nlohmann::json metrics = Json(Dtctl({"metrics", run, "--key", "loss", "--rank", "1", "-o", "json"}));
  ASSERT_EQ(metrics.size(), 6u);
  for (const char* key : {"step", "rank", "name", "value", "time"}) EXPECT_TRUE(metrics[0].contains(key)) << key;
  EXPECT_EQ(metrics[5]["step"], 6);
  CommandResult csv = Dtctl({"metrics", run, "--key", "lr", "-o", "csv"});
  EXPECT_EQ(csv.output.rfind("step,rank,name,value,time\n", 0), 0u) << csv.output;
  EXPECT_EQ(std::count(csv.output.begin(), csv.output.end(), '\n'), 13);  // header + 6 steps x 2 ranks

  nlohmann::json ckpts = Json(Dtctl({"checkpoints", run, "-o", "json"}));
  ASSERT_EQ(ckpts.size(), 2u);  // steps 3 and 6
  for (const char* key : {"step", "size", "time", "path", "committed"}) EXPECT_TRUE(ckpts[0].contains(key)) << key;
  EXPECT_EQ(ckpts[1]["step"], 6);
  EXPECT_TRUE(std::filesystem::exists(ckpts[1]["path"].get<std::string>() + "/model.pt"));

  CommandResult logs = Dtctl({"logs", run, "--rank", "0"});
  EXPECT_EQ(logs.exit_code, 0);
  EXPECT_NE(logs.output.find("done: 6 steps"), std::string::npos) << logs.output;
  // The launcher gave the ranks the best OpenBLAS kernels of this CPU (common/blas_core.h).
  EXPECT_NE(logs.output.find(testing::ExpectedOpenBlasKernels()), std::string::npos) << logs.output;
  EXPECT_EQ(Dtctl({"logs", run, "--rank", "7"}).exit_code, 2);

  CommandResult cancel = Dtctl({"cancel", run});
  EXPECT_EQ(cancel.exit_code, 0);
  EXPECT_NE(cancel.output.find("already ended SUCCEEDED"), std::string::npos) << cancel.output;
}

// The coordinator publishes a round after checking sizes; the digests the writer computed are
// checked by `dtctl checkpoints --verify` (reading every byte again, here) and by the rank that
// loads a checkpoint to resume, which refuses a corrupted one naming the file.
TEST_F(DtctlTest, ACorruptedCheckpointIsFoundByVerifyAndRefusedOnResume) {
  std::string run = Submit("verify", 2, 0, TrainerArgs(6, {"--ckpt-freq", "3"}));
  ASSERT_FALSE(run.empty());
  ASSERT_EQ(Dtctl({"watch", run}).exit_code, 0);
  CommandResult ok = Dtctl({"checkpoints", run, "--verify", "-o", "json"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  nlohmann::json listed = Json(ok);
  ASSERT_EQ(listed.size(), 2u);
  for (const auto& c : listed) EXPECT_EQ(c["verified"], "ok") << c;

  // One byte of the latest checkpoint's model flipped: same size, other content.
  std::string model = listed[1]["path"].get<std::string>() + "/model.pt";
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  CommandResult bad = Dtctl({"checkpoints", run, "--verify"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find(model + " does not match its manifest"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("do not resume from it"), std::string::npos) << bad.output;

  std::string again = Submit("verify", 2, 0, TrainerArgs(8));
  ASSERT_FALSE(again.empty());
  EXPECT_EQ(Dtctl({"watch", again}).exit_code, 1);
  nlohmann::json s = Status(again);
  EXPECT_EQ(s["state"], "FAILED");
  std::string cause = s["reason"].value("message", "");
  EXPECT_NE(cause.find("does not match its manifest"), std::string::npos) << s["reason"];
  EXPECT_NE(cause.find("model.pt"), std::string::npos) << s["reason"];
}

// systemd restarts dtcoord with SIGTERM: while it drains, calls end CANCELLED. A local run, its
// launcher and a watching dtctl ride the restart out like a kill -9 one: the run goes on. (The
// default 30 s heartbeat timeout here is 3 s: the ranks reconnect moments after it listens again.)
TEST_F(DtctlTest, AGracefulCoordinatorRestartLeavesALocalRunRunning) {
  CoordinatorProcess coord(tmp_.Sub("graceful-coord"), {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s"});
  std::map<std::string, std::string> env = {{"DT_COORDINATOR", coord.address()}, {"DT_TOKEN", coord.admin_token()}};
  std::vector<std::string> args = {
      "submit",           "-o", "json",           "--name", "graceful",      "--save-dir", save_dir_,
      "--nproc-per-node", "2",  "--max-restarts", "0",      "--omp-threads", "1"};
  std::vector<std::string> trainer = TrainerArgs(120);
  args.insert(args.end(), trainer.begin(), trainer.end());
  std::string run = Json(Dtctl(args, env)).value("run_id", "");
  ASSERT_FALSE(run.empty());
  auto status = [&] { return Json(Dtctl({"status", run, "-o", "json"}, env)); };
  std::string watch_log = JoinPath(tmp_.path(), "watch.log");
  Subprocess watch({testing::BinaryPath("dtctl"), "watch", run}, env, watch_log);
  ASSERT_TRUE(testing::WaitFor([&] { return status().value("step", 0) >= 5; }, absl::Minutes(2)));
  coord.StopAndRestart(SIGTERM);
  int exit = watch.Wait(absl::Minutes(3));
  ASSERT_NE(exit, -1) << testing::Slurp(watch_log);
  EXPECT_TRUE(WIFEXITED(exit) && WEXITSTATUS(exit) == 0) << testing::Slurp(watch_log);
  nlohmann::json s = status();
  EXPECT_EQ(s["state"], "SUCCEEDED") << s;
  EXPECT_EQ(s["restarts"], 0) << s;
  EXPECT_EQ(s["step"], 120);
  std::string launcher = testing::Slurp(save_dir_ + "/graceful/logs/launcher.log");
  EXPECT_EQ(launcher.find("refused"), std::string::npos) << launcher;
}

TEST_F(DtctlTest, KilledTrainerIsRelaunchedAndResumesFromTheLatestCheckpoint) {
  std::string run = Submit("relaunch", 2, 1, TrainerArgs(400, {"--ckpt-freq", "5"}));
  ASSERT_TRUE(testing::WaitFor(
      [&] { return Status(run).value("latest_checkpoint_step", nlohmann::json()).is_number(); }, absl::Minutes(2)));
  nlohmann::json before = Status(run);
  int victim = before["ranks"][1]["pid"];
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  // The launcher reports the death at once; the group restarts as generation 1.
  ASSERT_TRUE(testing::WaitFor([&] { return Status(run)["generation"] == 1; }, absl::Seconds(30)));
  nlohmann::json restarted = Status(run);
  EXPECT_EQ(restarted["restarts"], 1);
  ASSERT_FALSE(restarted["failures"].empty());
  EXPECT_EQ(restarted["failures"][0]["kind"], "PROCESS_EXITED");
  EXPECT_EQ(restarted["failures"][0]["rank"], 1);
  EXPECT_NE(restarted["failures"][0]["message"].get<std::string>().find("SIGKILL"), std::string::npos);
  // Generation 1 resumes from the checkpoint; a few steps past it, cancel (the test need not
  // train 400 steps) and check that no trainer survives.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        nlohmann::json s = Status(run);
        return s["state"] == "RUNNING" && s["generation"] == 1 &&
               s["step"].get<int>() > before["latest_checkpoint_step"].get<int>() + 2;
      },
      absl::Minutes(2)));
  std::string log = testing::Slurp(JoinPath(save_dir_, "relaunch/logs/rank-0.log"));
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  EXPECT_NE(log.find("generation 1"), std::string::npos);
  EXPECT_EQ(Dtctl({"cancel", run}).exit_code, 0);
  nlohmann::json end = Status(run);
  EXPECT_EQ(end["state"], "CANCELLED");
  // Every trainer of the run is gone.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        for (const auto& r : Status(run)["ranks"]) {
          if (::kill(r["pid"].get<int>(), 0) == 0) return false;
        }
        return true;
      },
      absl::Seconds(20)));
}

// An elastic dttrainer run keeps its global batch when a node is lost: the third node's trainer
// stops answering after step 8's checkpoint (SIGSTOP, as a hung node), the run goes on at once with
// the two nodes that remain (accumulation 3 instead of 2) from step 8, succeeds, and every step's
// loss is the uninterrupted three-node run's within 1e-4.
TEST_F(DtctlTest, AnElasticTrainerRunKeepsTheGlobalBatchAndTheLossesWhenANodeIsLost) {
  const std::string lost = absl::StrCat(HostName(), "-node2");
  auto submit = [&](const std::string& name, const std::string& nodes, std::vector<std::string> extra) {
    std::vector<std::string> args = {"submit",  "-o",
                                     "json",    "--name",
                                     name,      "--save-dir",
                                     save_dir_, "--nodes",
                                     nodes,     "--nproc-per-node",
                                     "1",       "--max-restarts",
                                     "1",       "--omp-threads",
                                     "1"};
    std::vector<std::string> trainer = TrainerArgs(
        16, {"--batch-size", "1", "--global-batch-size", "6", "--ckpt-freq", "4", "--seed", "3", "--dropout", "0"});
    trainer.insert(trainer.end(), extra.begin(), extra.end());
    args.insert(args.end(), trainer.begin(), trainer.end());
    CommandResult r = Dtctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::string run = Json(r).value("run_id", "");
    CommandResult watch = Dtctl({"watch", run});
    EXPECT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(save_dir_, name + "/logs/launcher.log"));
    return run;
  };
  std::string whole = submit("whole", "3", {});
  std::string elastic = submit("elastic", "2:3", {"--stop-after-step", "8", "--stop-node", lost});

  nlohmann::json s = Status(elastic);
  EXPECT_EQ(s["state"], "SUCCEEDED") << s;
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["lost_nodes"], nlohmann::json::array({lost})) << s;
  EXPECT_EQ(s["failures"][0]["kind"], "HEARTBEAT_TIMEOUT") << s;
  EXPECT_EQ(s["failures"][0]["node"], lost) << s;
  std::string log = testing::Slurp(JoinPath(save_dir_, "elastic/logs/rank-0.log"));
  EXPECT_NE(log.find("with the global batch of 6 kept (2 ranks x batch 1 x accumulation 3)"), std::string::npos) << log;

  // Generation 0 trained steps 1..8 (and perhaps one more before the loss was seen), generation 1
  // steps 9..16 from step 8's checkpoint: each loss is the uninterrupted run's.
  testing::ExpectTheUninterruptedLosses(coord_.Metrics(whole, "loss", 0), coord_.Metrics(elastic, "loss", 0), 16, 1e-4);
}

TEST_F(DtctlTest, WithoutARestartBudgetTheRunFailsWithTheRootCause) {
  std::string run = Submit("no-budget", 2, 0, TrainerArgs(400));
  ASSERT_TRUE(testing::WaitFor([&] { return Status(run)["step"].get<int>() >= 2; }, absl::Minutes(2)));
  int victim = Status(run)["ranks"][0]["pid"];
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 1) << watch.output;
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "FAILED");
  EXPECT_EQ(s["reason"]["rank"], 0);
  EXPECT_EQ(s["reason"]["kind"], "PROCESS_EXITED");
  EXPECT_NE(s["reason"]["message"].get<std::string>().find("signal 9"), std::string::npos) << s["reason"];
  CommandResult human = Dtctl({"status", run});
  EXPECT_NE(human.output.find("reason     rank 0"), std::string::npos) << human.output;
}

// A fresh clone: the README's quick start names only the project's own data/ and no
// --tokenizer-dir; dtctl names the shipped GPT-2 files for the trainers, which train with them.
TEST_F(DtctlTest, WithoutATokenizerDirTheGpt2FilesShippedInDataAreUsed) {
  std::string shipped = JoinPath(DT_SOURCE_DIR, "data");
  std::string run = Submit("shipped-data", 1, 0,
                           {"--", "--dataset", JoinPath(shipped, "alpaca_sample.json"), "--model", "tiny", "--seq-len",
                            "64", "--batch-size", "2", "--max-steps", "2", "--log-freq", "1", "--eval-split", "0"});
  ASSERT_FALSE(run.empty());
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "SUCCEEDED") << s;
  std::vector<std::string> args = s["trainer_args"].get<std::vector<std::string>>();
  auto flag = std::find(args.begin(), args.end(), "--tokenizer-dir");
  ASSERT_NE(flag, args.end()) << s["trainer_args"];
  ASSERT_NE(flag + 1, args.end());
  EXPECT_EQ(std::filesystem::canonical(*(flag + 1)), std::filesystem::canonical(JoinPath(shipped, "gpt2")));
}

}  // namespace
}  // namespace dt
