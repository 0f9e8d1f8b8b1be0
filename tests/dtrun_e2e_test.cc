// A user's own PyTorch program under dt (`dtctl submit --exec`, dtrun): a plain torchrun-style DDP
// script that never imports dt runs unchanged with torchrun's environment, trains the same losses
// as under torchrun itself, restarts and resumes after a kill -9, and a Python exception is named
// as the run's root cause with its rank, type and message. Real processes: dtcoord, the local
// launcher, dtrun, Debian's python3-torch with Gloo.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;

const char* kPython = "/usr/bin/python3";

std::string Script() { return JoinPath(DT_SOURCE_DIR, "examples/python/train_ddp.py"); }

class DtrunTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  CoordinatorProcess coord_{tmp_.path(), {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s",
                                          "--rendezvous-timeout", "1m"}};

  CommandResult Dtctl(const std::vector<std::string>& args) {
    return testing::RunDtctl(coord_, args, {{"HOME", tmp_.path()}});
  }
  nlohmann::json Status(const std::string& run) { return testing::DtctlJson(Dtctl({"status", run, "-o", "json"})); }

  // `dtctl submit --exec -- python3 train_ddp.py ARGS` with 2 local ranks → run id.
  std::string SubmitScript(const std::string& name, int max_restarts, const std::vector<std::string>& script_args) {
    std::vector<std::string> args = {"submit", "-o", "json", "--name", name, "--save-dir", save_dir_,
                                     "--nproc-per-node", "2", "--max-restarts", absl::StrCat(max_restarts),
                                     "--exec", "--", kPython, Script()};
    args.insert(args.end(), script_args.begin(), script_args.end());
    CommandResult r = Dtctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::DtctlJson(r).value("run_id", "");
  }

  nlohmann::json EnvOf(const std::string& dir, int rank) {
    return nlohmann::json::parse(testing::Slurp(JoinPath(dir, absl::StrCat("env-rank-", rank, ".json"))), nullptr,
                                 false);
  }
};

TEST_F(DtrunTest, APlainTorchrunScriptRunsUnchangedWithTorchrunsEnvironmentAndLosses) {
  std::string env_dir = tmp_.Sub("env");
  std::string dt_losses = JoinPath(tmp_.path(), "losses-dt");
  std::string run = SubmitScript("plain", 0, {"--steps", "20", "--ckpt-every", "0", "--env-out", env_dir,
                                              "--losses-out", dt_losses});
  CommandResult watch = Dtctl({"watch", run});
  std::string exp_dir = JoinPath(save_dir_, "plain");
  ASSERT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));

  // Every rank saw torchrun's variables with the values torchrun would give.
  nlohmann::json e0 = EnvOf(env_dir, 0), e1 = EnvOf(env_dir, 1);
  ASSERT_FALSE(e0.is_discarded());
  ASSERT_FALSE(e1.is_discarded());
  for (int rank = 0; rank < 2; ++rank) {
    const nlohmann::json& e = rank == 0 ? e0 : e1;
    EXPECT_EQ(e["RANK"], absl::StrCat(rank)) << e;
    EXPECT_EQ(e["LOCAL_RANK"], absl::StrCat(rank)) << e;
    EXPECT_EQ(e["ROLE_RANK"], absl::StrCat(rank)) << e;
    EXPECT_EQ(e["WORLD_SIZE"], "2") << e;
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "2") << e;
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2") << e;
    EXPECT_EQ(e["GROUP_RANK"], "0") << e;
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1") << e;
    EXPECT_EQ(e["ROLE_NAME"], "default") << e;
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0") << e;
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "0") << e;
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], run) << e;
    EXPECT_EQ(e["TORCHELASTIC_ERROR_FILE"], JoinPath(exp_dir, absl::StrCat("logs/rank-", rank, ".error.json"))) << e;
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1") << e;  // torchrun's default with several processes per node
    EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1") << e;
    EXPECT_EQ(e["DT_RUN_ID"], run) << e;
    EXPECT_EQ(e["DT_EXPERIMENT_DIR"], exp_dir) << e;
    EXPECT_EQ(e["DT_COORDINATOR"], coord_.address()) << e;
    EXPECT_EQ(e["token_in_environment"], true) << e;
  }
  EXPECT_EQ(e0["MASTER_ADDR"], "127.0.0.1");  // the address that reaches the coordinator
  EXPECT_EQ(e0["MASTER_ADDR"], e1["MASTER_ADDR"]);
  EXPECT_EQ(e0["MASTER_PORT"], e1["MASTER_PORT"]);
  EXPECT_NE(e0["MASTER_PORT"], "0");

  // dtctl status shows the script's processes as the ranks' pids, and never the run token.
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "SUCCEEDED");
  EXPECT_EQ(s["ranks"][0]["pid"], e0["pid"]) << s;
  EXPECT_EQ(s["ranks"][1]["pid"], e1["pid"]) << s;
  EXPECT_EQ(s.dump().find("dt_run_"), std::string::npos) << s;
  EXPECT_NE(testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log")).find("done: 20 steps"), std::string::npos);

  // The same script under torchrun itself trains the same losses, step for step. (Debian's torch
  // 1.13 on Python 3.11 needs non-zero --redirects/--tee: its Std.from_str("0") returns None.)
  std::string torchrun_losses = JoinPath(tmp_.path(), "losses-torchrun");
  absl::StatusOr<CommandResult> torchrun = RunCommand(
      {kPython, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
       Script(), "--steps", "20", "--ckpt-every", "0", "--losses-out", torchrun_losses},
      absl::Minutes(3));
  ASSERT_TRUE(torchrun.ok()) << torchrun.status();
  ASSERT_EQ(torchrun->exit_code, 0) << torchrun->output;
  std::string dt_text = testing::Slurp(dt_losses);
  EXPECT_EQ(std::count(dt_text.begin(), dt_text.end(), '\n'), 20) << dt_text;
  EXPECT_EQ(dt_text, testing::Slurp(torchrun_losses));
}

TEST_F(DtrunTest, AKilledRankRestartsTheGroupWhichResumesFromTheScriptsCheckpoint) {
  std::string env_dir = tmp_.Sub("env");
  std::string run = SubmitScript("killed", 1, {"--steps", "40", "--ckpt-every", "5", "--step-sleep", "0.1",
                                               "--env-out", env_dir});
  std::string exp_dir = JoinPath(save_dir_, "killed");
  std::string checkpoint = JoinPath(exp_dir, "train_ddp.pt");
  ASSERT_TRUE(testing::WaitFor([&] { return ::access(checkpoint.c_str(), F_OK) == 0; }, absl::Minutes(2)));
  nlohmann::json s = Status(run);
  ASSERT_EQ(s["state"], "RUNNING") << s;
  int victim = s["ranks"][1]["pid"];
  ASSERT_EQ(victim, EnvOf(env_dir, 1)["pid"]);  // the script's process, not dtrun
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/dtrun-" + std::string(s["ranks"][1]["node"]) + ".log"));
  s = Status(run);
  EXPECT_EQ(s["state"], "SUCCEEDED");
  EXPECT_EQ(s["restarts"], 1);
  nlohmann::json failure = s["failures"][0];
  EXPECT_EQ(failure["rank"], 1) << failure;
  EXPECT_EQ(failure["kind"], "PROCESS_EXITED") << failure;
  EXPECT_NE(std::string(failure["message"]).find("killed by signal 9 (SIGKILL)"), std::string::npos) << failure;
  // The next generation saw the restart count, and resumed from what the script saved.
  EXPECT_EQ(EnvOf(env_dir, 1)["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(EnvOf(env_dir, 0)["TORCHELASTIC_MAX_RESTARTS"], "1");
  std::string log = testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  EXPECT_NE(log.find("rank 0: resumed from step"), std::string::npos) << log;
  EXPECT_NE(log.find("done: 40 steps"), std::string::npos) << log;
}

TEST_F(DtrunTest, APythonExceptionIsTheRootCauseWithItsRankTypeAndMessage) {
  std::string run = SubmitScript("raises", 0, {"--steps", "30", "--fail-rank", "1", "--fail-at-step", "3"});
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 1) << watch.output;
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "FAILED");
  nlohmann::json failure = s["failures"][0];
  EXPECT_EQ(failure["rank"], 1) << failure;
  EXPECT_EQ(failure["kind"], "REPORTED_ERROR") << failure;
  EXPECT_EQ(failure["exception_type"], "ValueError") << failure;
  std::string message = failure["message"];
  EXPECT_NE(message.find("injected failure at step 3"), std::string::npos) << message;
  EXPECT_NE(message.find("exited with code 1"), std::string::npos) << message;
  // The traceback torch's @record wrote is kept with the failure (shown by dtctl status).
  CommandResult table = Dtctl({"status", run});
  EXPECT_NE(table.output.find("ValueError: injected failure at step 3"), std::string::npos) << table.output;
  EXPECT_EQ(s["ranks"][1]["state"], "FAILED") << s;
}

TEST_F(DtrunTest, SubmitRefusesAProgramThatCannotRunAndCreatesNothing) {
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"/nonexistent/train"}, {"no-such-program-on-path"}, {Script()}}) {
    std::vector<std::string> args = {"submit", "--name", "bad", "--save-dir", save_dir_, "--exec", "--"};
    args.insert(args.end(), command.begin(), command.end());
    CommandResult r = Dtctl(args);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--exec: " + command.front()), std::string::npos) << r.output;
    EXPECT_EQ(::access(JoinPath(save_dir_, "bad").c_str(), F_OK), -1) << "an experiment dir was created";
  }
  // Not executable: the message says how to run it.
  CommandResult r = Dtctl({"submit", "--name", "bad", "--save-dir", save_dir_, "--exec", "--", Script()});
  EXPECT_NE(r.output.find("python3 " + Script()), std::string::npos) << r.output;
  r = Dtctl({"submit", "--name", "bad", "--save-dir", save_dir_, "--exec"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--exec needs the command after --"), std::string::npos) << r.output;
  EXPECT_TRUE(testing::DtctlJson(Dtctl({"list", "-o", "json"})).empty());
}

}  // namespace
}  // namespace dt
