// A user's own PyTorch program under dt (`dtctl submit --exec`, dtrun): a plain torchrun-style DDP
// script that never imports dt runs unchanged with torchrun's environment, trains the same losses
// as under torchrun itself, restarts and resumes after a kill -9, and a Python exception is named
// as the run's root cause with its rank, type and message. Real processes: dtcoord, the local
// launcher, dtrun, Debian's python3-torch with Gloo.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/blas_core.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/process_tree.h"
#include "common/procs_per_node.h"
#include "common/stop_signals.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;

const char* kPython = "/usr/bin/python3";

std::string Script() { return JoinPath(DT_SOURCE_DIR, "examples/python/train_ddp.py"); }
std::string DtScript() { return JoinPath(DT_SOURCE_DIR, "examples/python/train_dt.py"); }

class DtrunTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  CoordinatorProcess coord_{tmp_.path(),
                            {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s", "--rendezvous-timeout", "1m",
                             "--metrics-listen", "127.0.0.1:0"}};

  CommandResult Dtctl(const std::vector<std::string>& args, std::map<std::string, std::string> env = {}) {
    env["HOME"] = tmp_.path();
    return testing::RunDtctl(coord_, args, env);
  }
  nlohmann::json Status(const std::string& run) { return testing::DtctlJson(Dtctl({"status", run, "-o", "json"})); }

  // `dtctl submit --exec -- python3 SCRIPT ARGS` with 2 local ranks → run id.
  std::string SubmitScript(const std::string& name, int max_restarts, const std::vector<std::string>& script_args,
                           const std::string& script = Script(), const std::map<std::string, std::string>& env = {},
                           const std::string& python = kPython) {
    std::vector<std::string> args = {"submit",
                                     "-o",
                                     "json",
                                     "--name",
                                     name,
                                     "--save-dir",
                                     save_dir_,
                                     "--nproc-per-node",
                                     "2",
                                     "--max-restarts",
                                     absl::StrCat(max_restarts),
                                     "--exec",
                                     "--",
                                     python,
                                     script};
    args.insert(args.end(), script_args.begin(), script_args.end());
    CommandResult r = Dtctl(args, env);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::DtctlJson(r).value("run_id", "");
  }

  // Runs a program of examples/python twice over 20 steps with a round every 5: whole, and with
  // rank 1 killed (SIGKILL, by itself: at a known step) at step 12, after the rounds of steps 5
  // and 10. The restart must resume rank 1 from step 10 and train exactly as the whole run: the
  // same losses step by step and bit for bit the same parameters at the end. Returns the killed
  // run's id and experiment directory.
  std::pair<std::string, std::string> ExpectAKilledRankResumesAsTheWholeRun(const std::string& name,
                                                                            const std::string& script,
                                                                            const std::string& python = kPython) {
    const std::string whole_name = name + "-whole";
    std::string whole = SubmitScript(whole_name, 0, {"--steps", "20", "--ckpt-every", "5"}, script, {}, python);
    CommandResult watch = Dtctl({"watch", whole});
    EXPECT_EQ(watch.exit_code, 0) << watch.output
                                  << testing::Slurp(JoinPath(save_dir_, whole_name + "/logs/rank-0.log"));
    std::string run =
        SubmitScript(name, 1, {"--steps", "20", "--ckpt-every", "5", "--kill-rank", "1", "--kill-at-step", "12"},
                     script, {}, python);
    std::string exp_dir = JoinPath(save_dir_, name);
    watch = Dtctl({"watch", run});
    EXPECT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
    if (::testing::Test::HasFailure()) return {run, exp_dir};
    EXPECT_EQ(Status(run)["restarts"], 1);
    std::string log1 = testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));
    EXPECT_NE(log1.find("rank 1: resumed from step 10"), std::string::npos) << log1;
    EXPECT_EQ(Status(run)["failures"][0]["rank"], 1) << Status(run);

    std::vector<v1::MetricRecord> expected = coord_.Metrics(whole, "loss", 0);
    std::vector<v1::MetricRecord> got = coord_.Metrics(run, "loss", 0);
    EXPECT_EQ(expected.size(), 20u);
    EXPECT_EQ(got.size(), 20u);
    for (size_t k = 0; k < std::min(expected.size(), got.size()); ++k) {
      EXPECT_NEAR(got[k].value(), expected[k].value(), 1e-9) << "step " << k + 1;
    }
    auto final_line = [&](const std::string& dir) {
      std::string log = testing::Slurp(JoinPath(save_dir_, dir + "/logs/rank-0.log"));
      size_t at = log.find("done: 20 steps, parameters sha256 ");
      return at == std::string::npos ? std::string("(no final line)\n" + log) : log.substr(at, log.find('\n', at) - at);
    };
    EXPECT_EQ(final_line(name), final_line(whole_name));
    return {run, exp_dir};
  }

  // The manifest of step-20, the last round of ExpectAKilledRankResumesAsTheWholeRun's runs, which
  // two ranks wrote together: sharded, world size 2 (null when it cannot be read).
  nlohmann::json ShardedManifestOfTheLastRound(const std::string& exp_dir) {
    nlohmann::json manifest =
        nlohmann::json::parse(testing::Slurp(JoinPath(exp_dir, "checkpoints/step-20/manifest.json")), nullptr, false);
    EXPECT_FALSE(manifest.is_discarded()) << exp_dir;
    if (manifest.is_discarded()) return nullptr;
    EXPECT_EQ(manifest["world_size"], 2) << manifest;
    EXPECT_EQ(manifest["sharded"], true) << manifest;
    return manifest;
  }

  nlohmann::json EnvOf(const std::string& dir, int rank) {
    return nlohmann::json::parse(testing::Slurp(JoinPath(dir, absl::StrCat("env-rank-", rank, ".json"))), nullptr,
                                 false);
  }
};

TEST_F(DtrunTest, APlainTorchrunScriptRunsUnchangedWithTorchrunsEnvironmentAndLosses) {
  std::string env_dir = tmp_.Sub("env");
  std::string dt_losses = JoinPath(tmp_.path(), "losses-dt");
  std::string run =
      SubmitScript("plain", 0, {"--steps", "20", "--ckpt-every", "0", "--env-out", env_dir, "--losses-out", dt_losses});
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
    // Rank 0's process hosts the TCPStore (torchrun's c10d rendezvous): any torch version works.
    EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "False") << e;
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1") << e;  // torchrun's default with several processes per node
    EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1") << e;
    EXPECT_EQ(e["DT_RUN_ID"], run) << e;
    EXPECT_EQ(e["DT_EXPERIMENT_DIR"], exp_dir) << e;
    EXPECT_EQ(e["DT_COORDINATOR"], coord_.address()) << e;
    EXPECT_EQ(e["token_in_environment"], true) << e;
  }
  EXPECT_EQ(e0["MASTER_ADDR"], "127.0.0.1");  // the address that reaches the coordinator
  EXPECT_EQ(e0["MASTER_ADDR"], e1["MASTER_ADDR"]);
  // Rank 0's program hosts the store at its MASTER_PORT; rank 1 reaches it through dtrun's relay,
  // which listened before either started (client/dtrun/store_relay.h), and its log says so.
  EXPECT_NE(e0["MASTER_PORT"], "0");
  EXPECT_NE(e1["MASTER_PORT"], "0");
  EXPECT_NE(e0["MASTER_PORT"], e1["MASTER_PORT"]);
  std::string rank1_log = testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));
  EXPECT_TRUE(absl::StrContains(
      rank1_log, absl::StrCat("MASTER_PORT=", e1["MASTER_PORT"].get<std::string>(),
                              " (dtrun's relay to rank 0's store on ", e0["MASTER_PORT"].get<std::string>(), ")")))
      << rank1_log;

  // dtrun registered its node's two ranks in one RegisterNode call, not one Register each, and
  // heartbeat them on one NodeHeartbeats stream, not one Heartbeat call each (the coordinator's
  // own count of the calls it answered; a stream is counted when it ends, soon after dtrun's exit).
  absl::StatusOr<CommandResult> scraped;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        scraped = RunCommand({"curl", "-s", absl::StrCat("http://", coord_.metrics_address(), "/metrics")},
                             absl::Seconds(10));
        return scraped.ok() && scraped->output.find("method=\"NodeHeartbeats\"}") != std::string::npos;
      },
      absl::Seconds(20)))
      << (scraped.ok() ? scraped->output : scraped.status().ToString());
  EXPECT_NE(scraped->output.find("dt_coordinator_rpc_duration_seconds_count{code=\"OK\",method=\"RegisterNode\"} 1"),
            std::string::npos)
      << scraped->output;
  EXPECT_EQ(scraped->output.find("method=\"Register\""), std::string::npos);
  EXPECT_EQ(scraped->output.find("method=\"Heartbeat\""), std::string::npos);

  // The run succeeded when both ranks left, while their dtrun was still exiting: the launcher,
  // which sees the end at once on its WatchRun stream, lets dtrun exit by itself. (A dtrun
  // stopped at that moment logs a stop from outside and reports its ranks stopped.)
  const std::string launcher_log = JoinPath(exp_dir, "logs/launcher.log");
  ASSERT_TRUE(testing::WaitFor([&] { return absl::StrContains(testing::Slurp(launcher_log), "launcher exits"); },
                               absl::Seconds(30)))
      << testing::Slurp(launcher_log);
  int dtrun_logs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(JoinPath(exp_dir, "logs"))) {
    if (!absl::StartsWith(entry.path().filename().string(), "dtrun-")) continue;
    ++dtrun_logs;
    std::string log = testing::Slurp(entry.path().string());
    EXPECT_FALSE(absl::StrContains(log, "from outside")) << log;
    EXPECT_TRUE(absl::StrContains(log, "exited with code 0")) << log;
  }
  EXPECT_EQ(dtrun_logs, 1);
  EXPECT_TRUE(absl::StrContains(testing::Slurp(launcher_log), "exited with code 0"));
  // The launcher followed the run on one WatchRun stream (the other is this test's `dtctl watch`;
  // a stream is counted when it ends, with the run), asking with GetRun at most every 5 s beside
  // it, not every 250 ms as it once polled (about 4 calls a second).
  const std::string watched = "dt_coordinator_rpc_duration_seconds_count{code=\"OK\",method=\"WatchRun\"} 2";
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        scraped = RunCommand({"curl", "-s", absl::StrCat("http://", coord_.metrics_address(), "/metrics")},
                             absl::Seconds(10));
        return scraped.ok() && absl::StrContains(scraped->output, watched);
      },
      absl::Seconds(20)))
      << (scraped.ok() ? scraped->output : scraped.status().ToString());
  EXPECT_LE(
      testing::MetricValue(scraped->output, "dt_coordinator_rpc_duration_seconds_count{code=\"OK\",method=\"GetRun\"}"),
      4)
      << scraped->output;

  // dtctl status shows the script's processes as the ranks' pids, and never the run token.
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "SUCCEEDED");
  EXPECT_EQ(s["ranks"][0]["pid"], e0["pid"]) << s;
  EXPECT_EQ(s["ranks"][1]["pid"], e1["pid"]) << s;
  EXPECT_EQ(s.dump().find("dt_run_"), std::string::npos) << s;
  EXPECT_NE(testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log")).find("done: 20 steps"), std::string::npos);

  // The same script under torchrun itself trains the same losses, step for step, given the
  // OpenBLAS kernels dt gives its workers (on a CPU OpenBLAS does not know, better ones than its
  // own pick: common/blas_core.h; the kernels decide a loss's last digits). (Debian's torch 1.13
  // on Python 3.11 needs non-zero --redirects/--tee: its Std.from_str("0") returns None.)
  std::map<std::string, std::string> same_kernels;
  if (std::string core = OpenBlasCoreToSet(); !core.empty()) same_kernels["OPENBLAS_CORETYPE"] = core;
  std::string torchrun_losses = JoinPath(tmp_.path(), "losses-torchrun");
  absl::StatusOr<CommandResult> torchrun =
      RunCommand({kPython, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--redirects", "1",
                  "--tee", "1", Script(), "--steps", "20", "--ckpt-every", "0", "--losses-out", torchrun_losses},
                 absl::Minutes(3), same_kernels);
  ASSERT_TRUE(torchrun.ok()) << torchrun.status();
  ASSERT_EQ(torchrun->exit_code, 0) << torchrun->output;
  std::string dt_text = testing::Slurp(dt_losses);
  EXPECT_EQ(std::count(dt_text.begin(), dt_text.end(), '\n'), 20) << dt_text;
  EXPECT_EQ(dt_text, testing::Slurp(torchrun_losses));
}

// With DT_AGENT_STORE=1 group rank 0's dtrun hosts the workers' TCPStore (dtrun-store): each
// generation's dtrun starts its own, and the workers reach it through torch's per-attempt prefix.
TEST_F(DtrunTest, AKilledRankRestartsTheGroupWhichResumesFromTheScriptsCheckpoint) {
  std::string env_dir = tmp_.Sub("env");
  std::string run =
      SubmitScript("killed", 1, {"--steps", "40", "--ckpt-every", "5", "--step-sleep", "0.1", "--env-out", env_dir},
                   Script(), {{"DT_AGENT_STORE", "1"}});
  EXPECT_TRUE(testing::WaitFor([&] { return ::access(JoinPath(env_dir, "env-rank-1.json").c_str(), F_OK) == 0; },
                               absl::Minutes(1)));
  EXPECT_EQ(EnvOf(env_dir, 1)["TORCHELASTIC_USE_AGENT_STORE"], "True");
  std::string exp_dir = JoinPath(save_dir_, "killed");
  std::string checkpoint = JoinPath(exp_dir, "train_ddp.pt");
  ASSERT_TRUE(testing::WaitFor([&] { return ::access(checkpoint.c_str(), F_OK) == 0; }, absl::Minutes(2)));
  nlohmann::json s = Status(run);
  ASSERT_EQ(s["state"], "RUNNING") << s;
  int victim = s["ranks"][1]["pid"];
  ASSERT_EQ(victim, EnvOf(env_dir, 1)["pid"]);  // the script's process, not dtrun
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 0) << watch.output
                                << testing::Slurp(
                                       JoinPath(exp_dir, "logs/dtrun-" + std::string(s["ranks"][1]["node"]) + ".log"));
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
  EXPECT_EQ(EnvOf(env_dir, 0)["TORCHELASTIC_USE_AGENT_STORE"], "True");
  std::string log = testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  EXPECT_NE(log.find("rank 0: resumed from step"), std::string::npos) << log;
  EXPECT_NE(log.find("done: 40 steps"), std::string::npos) << log;
  // Each generation's dtrun logged once to its node's file: the launcher made that file its stderr,
  // which dtrun's own copy of its log (for Slurm, where stderr goes through srun) does not double.
  const std::string node = s["ranks"][1]["node"];
  std::string dtrun_log = testing::Slurp(JoinPath(exp_dir, "logs/dtrun-" + node + ".log"));
  const std::string said = "node " + node + " is group rank ";
  int times = 0;
  for (size_t at = dtrun_log.find(said); at != std::string::npos; at = dtrun_log.find(said, at + 1)) ++times;
  EXPECT_EQ(times, 2) << dtrun_log;
}

// The dtrun of the node that runs `pid` (its nearest dtrun ancestor); 0 when there is none.
// The workers' store (dtrun-store, DT_AGENT_STORE=1) killed under running ranks is the run's root
// cause, not the rank whose store call fails a few milliseconds later: its watcher wakes dtrun the
// moment it ends, and dtrun reports whichever ended first.
TEST_F(DtrunTest, AKilledWorkersStoreIsNamedAsTheCauseNotTheRanksThatLostIt) {
  const std::string ready = tmp_.Sub("ready");
  const std::string script = JoinPath(tmp_.path(), "store_user.py");
  std::ofstream(script) << R"(import os, socket, sys, time
rank = os.environ["RANK"]
store = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
deadline = time.time() + 60
while True:  # dtrun-store loads LibTorch as the ranks start: it listens a little later
    try:
        socket.create_connection(store, timeout=1).close()
        break
    except OSError as e:
        if time.time() > deadline:
            sys.exit("rank %s: the store at %s:%d never listened: %s" % (rank, store[0], store[1], e))
        time.sleep(0.05)
path = os.path.join(sys.argv[1], "rank-" + rank)
open(path + ".tmp", "w").write(str(os.getpid()))
os.replace(path + ".tmp", path)  # whole or not at all: the test reads it once it exists
deadline = time.time() + 120
while time.time() < deadline:
    try:
        socket.create_connection(store, timeout=1).close()
    except OSError as e:
        sys.exit("rank %s: the store at %s:%d is gone: %s" % (rank, store[0], store[1], e))
    time.sleep(0.005)
sys.exit("rank %s: the store outlived the test" % rank)
)";
  std::string run = SubmitScript("store-killed", 0, {ready}, script, {{"DT_AGENT_STORE", "1"}});
  const std::string rank0 = JoinPath(ready, "rank-0");
  ASSERT_TRUE(testing::WaitFor(
      [&] { return ::access(rank0.c_str(), F_OK) == 0 && ::access(JoinPath(ready, "rank-1").c_str(), F_OK) == 0; },
      absl::Minutes(1)));
  pid_t agent = testing::NodeAgentOf(std::stoi(testing::Slurp(rank0)));
  ASSERT_GT(agent, 0);
  pid_t store = testing::WorkersStoreOf(agent);
  ASSERT_GT(store, 0) << "no dtrun-store under dtrun " << agent;
  // The step's signals are for the ranks and dtrun: Slurm's SIGUSR2 or scancel's SIGTERM sent to
  // every process must leave the store up while the ranks checkpoint and leave.
  uint64_t ignored = testing::SignalMask(testing::Slurp(absl::StrCat("/proc/", store, "/status")), "SigIgn:");
  for (int sig : {SIGTERM, SIGINT, SIGUSR2}) {
    EXPECT_TRUE(testing::MaskHas(ignored, sig)) << "dtrun-store does not ignore " << SignalName(sig);
  }
  ASSERT_EQ(::kill(store, SIGKILL), 0);

  CommandResult watch = Dtctl({"watch", run});
  EXPECT_NE(watch.exit_code, 0) << watch.output;
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "FAILED") << s;
  ASSERT_FALSE(s["failures"].empty()) << s;
  const std::string cause = s["failures"][0]["message"];
  EXPECT_TRUE(absl::StrContains(cause, absl::StrCat("the workers' TCPStore (dtrun-store, pid ", store)) &&
              absl::StrContains(cause, "killed by signal 9 (SIGKILL)"))
      << s["failures"];
  // (The ranks notice within 5 ms and exit with their own message; dtrun looks at the store before
  // them and names it unless a rank ended well before it: node_agent.cc, StoreEndedFirst.)
}

// An elastic run (--nodes 2:3) whose third node stops answering (its dtrun and program stopped with
// SIGSTOP, as a node that hangs or drops off the network) goes on at once on the two that remain,
// from the script's checkpoint, with WORLD_SIZE 2, and succeeds; status shows both generations.
TEST_F(DtrunTest, AnElasticRunGoesOnWithTheNodesThatRemainWhenOneIsLost) {
  std::string env_dir = tmp_.Sub("env");
  CommandResult submitted = Dtctl({"submit",  "-o",
                                   "json",    "--name",
                                   "elastic", "--save-dir",
                                   save_dir_, "--nodes",
                                   "2:3",     "--nproc-per-node",
                                   "1",       "--max-restarts",
                                   "1",       "--exec",
                                   "--",      kPython,
                                   Script(),  "--steps",
                                   "40",      "--ckpt-every",
                                   "5",       "--step-sleep",
                                   "0.1",     "--env-out",
                                   env_dir});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  std::string run = testing::DtctlJson(submitted).value("run_id", "");
  std::string exp_dir = JoinPath(save_dir_, "elastic");
  std::string checkpoint = JoinPath(exp_dir, "train_ddp.pt");
  ASSERT_TRUE(testing::WaitFor([&] { return ::access(checkpoint.c_str(), F_OK) == 0; }, absl::Minutes(2)));
  nlohmann::json s = Status(run);
  ASSERT_EQ(s["state"], "RUNNING") << s;
  ASSERT_EQ(s["world_size"], 3) << s;
  std::string lost = s["ranks"][2]["node"];
  pid_t agent = testing::NodeAgentOf(s["ranks"][2]["pid"].get<int>());
  ASSERT_GT(agent, 0) << s;
  std::vector<pid_t> tree = Descendants(agent);
  tree.push_back(agent);
  SignalProcesses(tree, SIGSTOP);

  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/launcher.log"));
  s = Status(run);
  EXPECT_EQ(s["state"], "SUCCEEDED") << s;
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["generation"], 1);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["lost_nodes"], nlohmann::json::array({lost})) << s;
  ASSERT_EQ(s["generations"].size(), 2u) << s;
  EXPECT_EQ(s["generations"][0]["world_size"], 3) << s;
  EXPECT_EQ(s["generations"][1]["world_size"], 2) << s;
  nlohmann::json failure = s["failures"][0];
  EXPECT_EQ(failure["kind"], "HEARTBEAT_TIMEOUT") << failure;
  EXPECT_EQ(failure["node"], lost) << failure;
  EXPECT_NE(std::string(failure["message"]).find("lost: the run goes on with 2 of its 3 nodes"), std::string::npos)
      << failure;
  // The program of the second generation saw the new world, and resumed from its checkpoint.
  EXPECT_EQ(EnvOf(env_dir, 0)["WORLD_SIZE"], "2");
  EXPECT_EQ(EnvOf(env_dir, 1)["WORLD_SIZE"], "2");
  EXPECT_EQ(EnvOf(env_dir, 1)["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(EnvOf(env_dir, 1)["TORCHELASTIC_RESTART_COUNT"], "1");
  std::string log = testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  EXPECT_NE(log.find("rank 0: resumed from step"), std::string::npos) << log;
  EXPECT_NE(log.find("done: 40 steps"), std::string::npos) << log;
  // Nothing of the lost node is left running.
  for (pid_t p : tree) {
    std::optional<ProcessInfo> info = ReadProcess(p);
    EXPECT_TRUE(!info || info->state == 'Z') << "pid " << p << " is still there";
  }
  CommandResult status = Dtctl({"status", run});
  EXPECT_NE(status.output.find("2 = 2 node(s) x 1 (elastic: 2 to 3 nodes; lost " + lost + ")"), std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("generations 0: 3 ranks, 1: 2 ranks (without " + lost + ")"), std::string::npos)
      << status.output;
}

// Whichever hosts the workers' store (rank 0's program, or dtrun-store with DT_AGENT_STORE=1,
// which dtrun ends only once the ranks are stopped), the rank that raised is the cause.
TEST_F(DtrunTest, APythonExceptionIsTheRootCauseWithItsRankTypeAndMessage) {
  for (bool agent_store : {false, true}) {
    SCOPED_TRACE(agent_store ? "the store in dtrun" : "the store in rank 0");
    std::map<std::string, std::string> env;
    if (agent_store) env["DT_AGENT_STORE"] = "1";
    std::string run = SubmitScript(agent_store ? "raises-agent-store" : "raises", 0,
                                   {"--steps", "30", "--fail-rank", "1", "--fail-at-step", "3"}, Script(), env);
    CommandResult watch = Dtctl({"watch", run});
    EXPECT_EQ(watch.exit_code, 1) << watch.output;
    nlohmann::json s = Status(run);
    EXPECT_EQ(s["state"], "FAILED");
    ASSERT_EQ(s["failures"].size(), 1u) << s["failures"];
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
}

// The failing rank leaves a child that ignores SIGTERM, so its dtslot stops it for the whole grace
// (10 s) and ends long after rank 0, whose collective failed within moments for the lost peer.
// The cause is still rank 1's exception: dtrun orders ranks by when their programs ended (dtslot's
// status pipe), not by when their keepers did.
TEST_F(DtrunTest, TheFirstProgramToFailIsTheCauseEvenWhenWhatItLeftTakesTheGraceToStop) {
  std::string run = SubmitScript("raises-leaves-child", 0,
                                 {"--steps", "30", "--fail-rank", "1", "--fail-at-step", "3", "--fail-leaves-child"});
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 1) << watch.output;
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "FAILED");
  ASSERT_FALSE(s["failures"].empty()) << s;
  nlohmann::json failure = s["failures"][0];
  EXPECT_EQ(failure["rank"], 1) << s["failures"];
  EXPECT_EQ(failure["exception_type"], "ValueError") << failure;
  EXPECT_TRUE(absl::StrContains(failure["message"].get<std::string>(), "injected failure at step 3")) << failure;
  // The keeper stops the leftover at the grace's end (10 s after the program's): then nothing of
  // the rank is left.
  EXPECT_TRUE(testing::WaitFor([&] { return ProcessesWithMarker(MarkerIn({SlotMarker(run, 0, "rank-1")})).empty(); },
                               absl::Seconds(30)));
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

std::string ShowEnvScript() { return JoinPath(DT_SOURCE_DIR, "tests/python/show_env.py"); }

// What show_env.py wrote for `rank` in `generation` (null when it wrote nothing).
nlohmann::json ShownEnv(const std::string& dir, int generation, int rank) {
  return nlohmann::json::parse(
      testing::Slurp(JoinPath(dir, absl::StrCat("env-g", generation, "-rank-", rank, ".json"))), nullptr, false);
}

// --env and --env-file reach every rank, over dt's defaults; a run that names a W&B project gives
// each rank the W&B identity its own wandb.init() reads: after a kill -9 the restarted generation
// has the same WANDB_RUN_ID (the SHA-1 of the experiment dir, the id dt's forwarder uses), so it
// continues the same W&B run; under the main strategy only rank 0 logs.
TEST_F(DtrunTest, TheRunsVariablesAndItsW_BIdentityReachEveryRankAcrossARestart) {
  std::string out = tmp_.Sub("env");
  std::string env_file = JoinPath(tmp_.path(), "run.env");
  std::ofstream(env_file) << "# the run's settings\nexport HF_HOME='/data/hf cache'\n\nOMP_NUM_THREADS=3\n";
  CommandResult r = Dtctl({"submit",
                           "-o",
                           "json",
                           "--name",
                           "wandb-main",
                           "--save-dir",
                           save_dir_,
                           "--nproc-per-node",
                           "2",
                           "--max-restarts",
                           "1",
                           "--wandb-project",
                           "proj",
                           "--env-file",
                           env_file,
                           "--env",
                           "FOO=bar=baz qux",
                           "--env",
                           "OMP_NUM_THREADS=4",
                           "--exec",
                           "--",
                           kPython,
                           ShowEnvScript(),
                           out,
                           "FOO",
                           "HF_HOME",
                           "OMP_NUM_THREADS"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string run = testing::DtctlJson(r).value("run_id", "");
  CommandResult watch = Dtctl({"watch", run});
  std::string exp_dir = JoinPath(save_dir_, "wandb-main");
  EXPECT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["state"], "SUCCEEDED");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["failures"][0]["rank"], 1) << s["failures"];

  std::string id = Sha1Hex(exp_dir);
  for (auto [generation, rank] : std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {1, 1}}) {
    nlohmann::json e = ShownEnv(out, generation, rank);
    SCOPED_TRACE(absl::StrCat("generation ", generation, " rank ", rank, ": ", e.dump()));
    ASSERT_TRUE(e.is_object());
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], absl::StrCat(generation));
    EXPECT_EQ(e["FOO"], "bar=baz qux");
    EXPECT_EQ(e["HF_HOME"], "/data/hf cache");
    EXPECT_EQ(e["OMP_NUM_THREADS"], "4");  // --env over --env-file, and over dt's 1 a process
    EXPECT_EQ(e["WANDB_RUN_ID"], id);      // the same W&B run in every generation
    EXPECT_EQ(e["WANDB_RESUME"], "allow");
    EXPECT_EQ(e["WANDB_RUN_GROUP"], "wandb-main");
    EXPECT_EQ(e["WANDB_PROJECT"], "proj");
    EXPECT_EQ(e["WANDB_DIR"], JoinPath(exp_dir, "wandb"));
    EXPECT_EQ(e["WANDB_DIR_EXISTS"], true);
    EXPECT_FALSE(e.contains("WANDB_API_KEY"));  // never from dt
    if (rank == 0) {
      EXPECT_FALSE(e.contains("WANDB_MODE"));
    } else {
      EXPECT_EQ(e["WANDB_MODE"], "disabled");  // main: rank 0 alone logs
    }
  }
}

// --log-strategy all: one W&B run per rank in the experiment's group. With no project named, the
// WANDB_* settings of the submitting environment are enough, and what the user set there stands.
TEST_F(DtrunTest, UnderTheAllStrategyEachRankIsItsOwnW_BRunInTheExperimentsGroup) {
  std::string out = tmp_.Sub("env");
  CommandResult r =
      Dtctl({"submit", "-o", "json", "--name", "wandb-all", "--save-dir", save_dir_, "--nproc-per-node", "2",
             "--max-restarts", "1", "--log-strategy", "all", "--exec", "--", kPython, ShowEnvScript(), out},
            {{"WANDB_ENTITY", "team"}, {"WANDB_RESUME", "must"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string run = testing::DtctlJson(r).value("run_id", "");
  EXPECT_EQ(Dtctl({"watch", run}).exit_code, 0);
  for (int rank : {0, 1}) {
    nlohmann::json e = ShownEnv(out, 1, rank);
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(e["WANDB_RUN_ID"], absl::StrCat("wandb-all-", rank));
    EXPECT_EQ(ShownEnv(out, 0, 1)["WANDB_RUN_ID"], "wandb-all-1");
    EXPECT_EQ(e["WANDB_RUN_GROUP"], "wandb-all");
    EXPECT_FALSE(e.contains("WANDB_MODE"));  // every rank logs
    EXPECT_FALSE(e.contains("WANDB_PROJECT"));
    EXPECT_EQ(e["WANDB_ENTITY"], "team");  // inherited
    EXPECT_EQ(e["WANDB_RESUME"], "must");  // the user's, not dt's "allow"
  }
}

// --env reaches dttrainer too (the local launcher starts it with the run's variables).
TEST_F(DtrunTest, TheRunsVariablesReachEveryDttrainer) {
  CommandResult r = Dtctl({"submit",
                           "-o",
                           "json",
                           "--name",
                           "trainer-env",
                           "--save-dir",
                           save_dir_,
                           "--nproc-per-node",
                           "2",
                           "--env",
                           "FOO=two words",
                           "--env",
                           "OMP_NUM_THREADS=3",
                           "--",
                           "--dataset",
                           JoinPath(testing::DataDir(), "alpaca_sample.json"),
                           "--model",
                           "tiny",
                           "--seq-len",
                           "32",
                           "--batch-size",
                           "1",
                           "--max-steps",
                           "100000",
                           "--log-freq",
                           "1",
                           "--eval-split",
                           "0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string run = testing::DtctlJson(r).value("run_id", "");
  nlohmann::json s;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        s = Status(run);
        return s["state"] == "RUNNING" && s["ranks"].size() == 2 && s["ranks"][0].value("pid", 0) > 0 &&
               s["ranks"][1].value("pid", 0) > 0;
      },
      absl::Minutes(2)))
      << s.dump(2);
  for (const auto& rank : s["ranks"]) {
    pid_t pid = rank["pid"].get<int>();
    EXPECT_EQ(ProcessEnv(pid, "FOO").value_or("(unset)"), "two words") << rank;
    // The user's, over the launcher's cores / trainers.
    EXPECT_EQ(ProcessEnv(pid, "OMP_NUM_THREADS").value_or("(unset)"), "3") << rank;
  }
  EXPECT_EQ(Dtctl({"cancel", run}).exit_code, 0);
}

// The lines of `output` that start with `prefix`, in order.
std::vector<std::string> LinesStartingWith(const std::string& output, const std::string& prefix) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(line, prefix)) out.emplace_back(line);
  }
  return out;
}

// dtctl logs --all: both ranks' lines in one stream in the order they were printed (the ranks
// take turns, each waiting for the other's line to reach its log); --fold shows a line both
// printed once; --grep keeps what it finds.
TEST_F(DtrunTest, LogsAllShowsEveryRanksLinesInTimeOrder) {
  std::string run = SubmitScript("turns", 0, {"6"}, JoinPath(DT_SOURCE_DIR, "tests/python/take_turns.py"));
  CommandResult watch = Dtctl({"watch", run});
  ASSERT_EQ(watch.exit_code, 0) << watch.output;
  CommandResult all = Dtctl({"logs", run, "--all"});
  ASSERT_EQ(all.exit_code, 0) << all.output;
  std::vector<std::string> turns;
  for (const std::string& line : LinesStartingWith(all.output, "[rank ")) {
    if (absl::StrContains(line, "] turn ")) turns.push_back(line);
  }
  EXPECT_EQ(turns, (std::vector<std::string>{"[rank 0] turn 0", "[rank 1] turn 1", "[rank 0] turn 2", "[rank 1] turn 3",
                                             "[rank 0] turn 4", "[rank 1] turn 5"}))
      << all.output;
  EXPECT_EQ(LinesStartingWith(all.output, "[rank 0] both ranks print this").size(), 1u) << all.output;
  EXPECT_EQ(LinesStartingWith(all.output, "[rank 1] both ranks print this").size(), 1u) << all.output;

  CommandResult folded = Dtctl({"logs", run, "--all", "--fold"});
  ASSERT_EQ(folded.exit_code, 0) << folded.output;
  EXPECT_EQ(LinesStartingWith(folded.output, "[ranks 0-1] both ranks print this").size(), 1u) << folded.output;
  EXPECT_TRUE(LinesStartingWith(folded.output, "[rank 0] both").empty()) << folded.output;
  EXPECT_EQ(LinesStartingWith(folded.output, "[rank 1] turn 5").size(), 1u) << folded.output;

  CommandResult odd = Dtctl({"logs", run, "--all", "--grep", "turn [13]"});
  ASSERT_EQ(odd.exit_code, 0) << odd.output;
  EXPECT_EQ(LinesStartingWith(odd.output, "[rank"), (std::vector<std::string>{"[rank 1] turn 1", "[rank 1] turn 3"}))
      << odd.output;

  CommandResult bad = Dtctl({"logs", run, "--all", "--grep", "turn ("});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "--grep turn ( is not a regular expression")) << bad.output;
  CommandResult fold_alone = Dtctl({"logs", run, "--fold"});
  EXPECT_EQ(fold_alone.exit_code, 2) << fold_alone.output;
  EXPECT_TRUE(absl::StrContains(fold_alone.output, "add --all")) << fold_alone.output;
}

// A program that writes what dtrun gave its rank (RANK WORLD_SIZE LOCAL_WORLD_SIZE) to
// <out>/rank-<RANK> and exits: no Python, so dozens of ranks start in a moment.
std::vector<std::string> ShowWorld(const std::string& out) {
  return {"/bin/sh", "-c", "echo \"$RANK $WORLD_SIZE $LOCAL_WORLD_SIZE\" > \"$0/rank-$RANK\"", out};
}

// The CPUs this process may run on, in order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  }
  return out;
}

// `taskset -c CPUS` for the first `count` allowed CPUs: what a node of that many CPUs would count.
std::vector<std::string> OnCpus(int count) {
  std::vector<int> cpus = AllowedCpus();
  cpus.resize(std::min<size_t>(cpus.size(), count));
  return {"/usr/bin/taskset", "-c", absl::StrJoin(cpus, ",")};
}

// torchrun's --nproc-per-node values on a local run, counted by dtctl on this machine: auto is
// one rank per CPU here (no GPU), shown by `dtctl status`; gpu without a GPU is refused before
// anything is created, saying what was looked at; a GPU machine would get one rank per GPU.
TEST_F(DtrunTest, NprocPerNodeAutoCountsThisMachineAndGpuWithoutOneIsRefused) {
  int cpus = static_cast<int>(std::min<size_t>(AllowedCpus().size(), 2));
  std::string out = tmp_.Sub("world");
  // dtctl under taskset: the machine, as dtctl counts it, has `cpus` CPUs.
  std::vector<std::string> submit = OnCpus(cpus);
  for (const std::string& a :
       {testing::BinaryPath("dtctl"), std::string("submit"), std::string("-o"), std::string("json"),
        std::string("--name"), std::string("auto"), std::string("--save-dir"), save_dir_,
        std::string("--nproc-per-node"), std::string("auto"), std::string("--exec"), std::string("--")}) {
    submit.push_back(a);
  }
  for (const std::string& a : ShowWorld(out)) submit.push_back(a);
  absl::StatusOr<CommandResult> submitted =
      RunCommand(submit, absl::Minutes(2),
                 {{"DT_COORDINATOR", coord_.address()}, {"DT_TOKEN", coord_.admin_token()}, {"HOME", tmp_.path()}});
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const CommandResult& r = *submitted;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string run = testing::DtctlJson(r).value("run_id", "");
  CommandResult watch = Dtctl({"watch", run});
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  for (int rank = 0; rank < cpus; ++rank) {
    EXPECT_EQ(testing::Slurp(JoinPath(out, absl::StrCat("rank-", rank))),
              absl::StrCat(rank, " ", cpus, " ", cpus, "\n"));
  }
  EXPECT_EQ(::access(JoinPath(out, absl::StrCat("rank-", cpus)).c_str(), F_OK), -1) << "more ranks than CPUs";
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["procs_per_node"], cpus);
  EXPECT_EQ(s["procs_per_node_rule"], "auto");
  CommandResult text = Dtctl({"status", run});
  EXPECT_TRUE(absl::StrContains(
      text.output,
      absl::StrCat(cpus, " = 1 node(s) x ", cpus, " (--nproc-per-node auto, counted on the submitting machine)")))
      << text.output;

  int gpus = ProbeThisNode().gpus;
  CommandResult gpu = Dtctl({"submit", "--name", "gpu", "--save-dir", save_dir_, "--nproc-per-node", "gpu",
                             gpus > 0 ? "--dry-run" : "--exec", "--exec", "--", "/bin/true"});
  if (gpus == 0) {
    EXPECT_EQ(gpu.exit_code, 2) << gpu.output;
    EXPECT_TRUE(absl::StrContains(gpu.output, "--nproc-per-node gpu: node")) << gpu.output;
    EXPECT_TRUE(absl::StrContains(gpu.output, "has no GPU its processes can see (no /dev/nvidia<N> device"))
        << gpu.output;
    EXPECT_EQ(::access(JoinPath(save_dir_, "gpu").c_str(), F_OK), -1) << "an experiment dir was created";
  } else {
    EXPECT_EQ(gpu.exit_code, 0) << gpu.output;
    EXPECT_TRUE(absl::StrContains(gpu.output, absl::StrCat("--nproc-per-node ", gpus))) << gpu.output;
  }
  CommandResult typo = Dtctl(
      {"submit", "--name", "x", "--save-dir", save_dir_, "--nproc-per-node", "gpus", "--exec", "--", "/bin/true"});
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_TRUE(absl::StrContains(typo.output, "\"gpus\" is not a count")) << typo.output;
}

// The user's own sbatch script style (dtrun creates or joins the run, no dtctl): each node's
// dtrun counts --nproc-per-node cpu itself. Nodes with as many CPUs agree and the run forms at
// their count; a node with fewer CPUs than the first ends the run, naming both counts, at once.
TEST_F(DtrunTest, NodesCountNprocPerNodeCpuThemselvesAndANodeThatDiffersEndsTheRun) {
  if (AllowedCpus().size() < 2) GTEST_SKIP() << "two nodes with different CPU counts need two CPUs here";
  auto dtrun = [&](const std::string& experiment, const std::string& node, int cpus, const std::string& out) {
    std::vector<std::string> argv = OnCpus(cpus);
    for (const std::string& a : {testing::BinaryPath("dtrun"), std::string("--coordinator"), coord_.address(),
                                 std::string("--experiment-name"), experiment, std::string("--save-dir"), save_dir_,
                                 std::string("--nnodes"), std::string("2"), std::string("--nproc-per-node"),
                                 std::string("cpu"), std::string("--node"), node, std::string("--")}) {
      argv.push_back(a);
    }
    for (const std::string& a : ShowWorld(out)) argv.push_back(a);
    return std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{{"DT_TOKEN", coord_.admin_token()}},
                                        JoinPath(tmp_.path(), experiment + "-" + node + ".log"));
  };
  auto run_of = [&](const std::string& experiment) {
    for (const nlohmann::json& r : testing::DtctlJson(Dtctl({"list", "-o", "json"}))) {
      if (r["name"] == experiment) return r["run_id"].get<std::string>();
    }
    return std::string();
  };

  std::string out = tmp_.Sub("alike");
  auto a = dtrun("alike", "a", 1, out);
  auto b = dtrun("alike", "b", 1, out);
  EXPECT_EQ(a->Wait(absl::Minutes(2)), 0) << testing::Slurp(JoinPath(tmp_.path(), "alike-a.log"));
  EXPECT_EQ(b->Wait(absl::Minutes(2)), 0) << testing::Slurp(JoinPath(tmp_.path(), "alike-b.log"));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(testing::Slurp(JoinPath(out, absl::StrCat("rank-", rank))), absl::StrCat(rank, " 2 1\n"));
  }
  nlohmann::json alike = Status(run_of("alike"));
  EXPECT_EQ(alike["state"], "SUCCEEDED") << alike.dump(2);
  EXPECT_EQ(alike["world_size"], 2);
  EXPECT_EQ(alike["procs_per_node_rule"], "cpu");
  EXPECT_TRUE(alike["procs_per_node_counted_on"] == "a" || alike["procs_per_node_counted_on"] == "b") << alike;

  // The first node counts two CPUs and waits in the rendezvous; the second counts one.
  auto big = dtrun("uneven", "big", 2, tmp_.Sub("uneven"));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string run = run_of("uneven");
        return !run.empty() && Status(run)["state"] == "RENDEZVOUS";
      },
      absl::Seconds(60)));
  auto small = dtrun("uneven", "small", 1, tmp_.Sub("uneven"));
  EXPECT_EQ(small->Wait(absl::Minutes(1)), 2 << 8) << testing::Slurp(JoinPath(tmp_.path(), "uneven-small.log"));
  EXPECT_NE(big->Wait(absl::Minutes(1)), 0);
  nlohmann::json uneven = Status(run_of("uneven"));
  EXPECT_EQ(uneven["state"], "FAILED") << uneven.dump(2);
  EXPECT_EQ(uneven["reason"]["kind"], "MISCONFIGURED");
  std::string why = uneven["reason"]["message"];
  EXPECT_TRUE(absl::StrContains(why,
                                "node \"small\" counted 1 processes (--nproc-per-node cpu) but node \"big\" "
                                "counted 2"))
      << why;
  EXPECT_TRUE(absl::StrContains(testing::Slurp(JoinPath(tmp_.path(), "uneven-small.log")), why))
      << "dtrun did not say why";
}

// dt's own names cannot be set (the rank's identity would disagree with dt's); each refusal names
// the variable and why, and nothing is submitted.
TEST_F(DtrunTest, SubmitRefusesVariablesDtSetsItselfAndMalformedOnes) {
  std::string bad_file = JoinPath(tmp_.path(), "bad.env");
  std::ofstream(bad_file) << "GOOD=1\nthis line has no equals sign\n";
  for (const auto& [flags, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--env", "RANK=3"}, "environment variable RANK cannot be set: dtrun sets it for each rank"},
           {{"--env", "MASTER_PORT=1"}, "environment variable MASTER_PORT cannot be set"},
           {{"--env", "DT_RUN_ID=x"}, "environment variable DT_RUN_ID cannot be set: DT_* variables are dt's own"},
           {{"--env", "TORCHELASTIC_RESTART_COUNT=9"}, "TORCHELASTIC_RESTART_COUNT cannot be set"},
           {{"--env", "1BAD=x"}, "environment variable name \"1BAD\" is not letters, digits and '_'"},
           {{"--env", "NOVALUE"}, "--env \"NOVALUE\" is not KEY=VALUE"},
           {{"--env-file", bad_file}, absl::StrCat("env file ", bad_file, " line 2")},
           {{"--env-file", "/nonexistent/run.env"}, "--env-file /nonexistent/run.env cannot be read"}}) {
    std::vector<std::string> args = {"submit", "--name", "bad-env", "--save-dir", save_dir_};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--exec", "--", kPython, ShowEnvScript(), "/tmp"});
    CommandResult r = Dtctl(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
  EXPECT_EQ(::access(JoinPath(save_dir_, "bad-env").c_str(), F_OK), -1) << "an experiment dir was created";
  EXPECT_TRUE(testing::DtctlJson(Dtctl({"list", "-o", "json"})).empty());
}

// A script that uses the dt module: its dt.log points reach the coordinator once each (and feed
// the run's step), its dt.checkpoint rounds are committed by the coordinator and listed, and after
// a kill -9 the group resumes from the latest round.
TEST_F(DtrunTest, TheDtModuleLogsMetricsAndCheckpointsAndResumesFromItsRounds) {
  std::string run =
      SubmitScript("module", 1, {"--steps", "30", "--ckpt-every", "5", "--step-sleep", "0.1"}, DtScript());
  std::string exp_dir = JoinPath(save_dir_, "module");
  ASSERT_TRUE(testing::WaitFor(
      [&] { return Status(run).value("latest_checkpoint_step", nlohmann::json()).is_number(); }, absl::Minutes(2)))
      << testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  nlohmann::json s = Status(run);
  ASSERT_EQ(::kill(s["ranks"][0]["pid"].get<int>(), SIGKILL), 0);
  CommandResult watch = Dtctl({"watch", run});
  ASSERT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  s = Status(run);
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["step"], 30) << s;  // dt.log's steps are the run's progress
  EXPECT_EQ(s["latest_checkpoint_step"], 30) << s;
  std::string log = testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));
  EXPECT_NE(log.find("under dt: True"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1: resumed from step"), std::string::npos) << log;
  EXPECT_NE(log.find(JoinPath(exp_dir, "checkpoints/step-")), std::string::npos) << log;

  // The kept rounds (3 by default), each with the writer's file verified by the coordinator.
  nlohmann::json cks = testing::DtctlJson(Dtctl({"checkpoints", run, "-o", "json"}));
  ASSERT_EQ(cks.size(), 3u) << cks;
  EXPECT_EQ(cks[2]["step"], 30) << cks;
  EXPECT_GT(cks[2]["size"].get<int64_t>(), 1000) << cks;
  std::string manifest = testing::Slurp(JoinPath(exp_dir, "checkpoints/step-30/manifest.json"));
  EXPECT_NE(manifest.find("state.pt"), std::string::npos) << manifest;

  // Each step's loss, once per rank: the steps a restart repeated replaced, not doubled.
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<v1::MetricRecord> loss = coord_.Metrics(run, "loss", rank);
    ASSERT_EQ(loss.size(), 30u) << "rank " << rank;
    for (int k = 0; k < 30; ++k) EXPECT_EQ(loss[k].step(), k + 1);
  }
}

// Any rank's failure aborts a round of the dt module, at once: rank 1's exception in its block, or
// a writer whose files cannot be committed (a subdirectory). The other rank's commit ends with the
// cause (not after the round's lease), and no checkpoint is published.
TEST_F(DtrunTest, AnyRanksFailureAbortsADtModuleRound) {
  // writer-finds-round-aborted: rank 1's abort removes the round's directory before the writer
  // lists its files; writer-saves-into-aborted-round: before it saves (both races
  // non-writer-raises meets now and then). The writer hears rank 1's abort, not a missing file.
  for (const std::string mode :
       {"non-writer-raises", "writer-finds-round-aborted", "writer-saves-into-aborted-round", "writer-saves-subdir"}) {
    std::string run = SubmitScript(mode, 0, {mode}, JoinPath(DT_SOURCE_DIR, "tests/python/dt_round.py"));
    CommandResult watch = Dtctl({"watch", run});
    std::string exp_dir = JoinPath(save_dir_, mode);
    std::string log0 = testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
    std::string log1 = testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));
    ASSERT_EQ(watch.exit_code, 0) << mode << "\n" << log0 << log1;
    bool rank1_raises = mode != "writer-saves-subdir";
    std::string other = rank1_raises ? log0 : log1;  // the rank that did not fail
    EXPECT_NE(other.find("round: not committed"), std::string::npos) << mode << "\n" << other;
    EXPECT_NE(other.find(rank1_raises ? "rank 1 aborted the checkpoint at step 1" : "cannot be committed"),
              std::string::npos)
        << mode << "\n"
        << other;
    EXPECT_NE(log0.find("latest: None"), std::string::npos) << log0;
    EXPECT_EQ(testing::DtctlJson(Dtctl({"checkpoints", run, "-o", "json"})).size(), 0u) << mode;
  }
}

// Any rank's failure in a sharded round of the dt module aborts it for every rank, saying why: two
// ranks claiming one file, a rank's exception after it saved its shard, a file no rank claimed, a
// subdirectory, a claimed symbolic link, a rank killed mid-round. Nothing of the round is left.
TEST_F(DtrunTest, AnyRanksFailureAbortsAShardedRound) {
  const std::map<std::string, std::string> cause = {
      {"sharded-duplicate", "\"state.bin\" is claimed by rank "},
      {"sharded-rank-raises", "rank 1 aborted the checkpoint at step 1: ValueError: a bad batch on rank 1"},
      {"sharded-unclaimed", "\"forgotten.bin\", which no rank's manifest lists"},
      {"sharded-subdir", "\"nested\", which no rank's manifest lists"},
      {"sharded-symlink", "link.bin was claimed but is not a plain file"},
      {"sharded-rank-dies", ""}};
  for (const auto& [mode, why] : cause) {
    std::string run = SubmitScript(mode, 0, {mode}, JoinPath(DT_SOURCE_DIR, "tests/python/dt_round.py"));
    CommandResult watch = Dtctl({"watch", run});
    std::string exp_dir = JoinPath(save_dir_, mode);
    std::string log0 = testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
    std::string log1 = testing::Slurp(JoinPath(exp_dir, "logs/rank-1.log"));
    auto left = [&] {
      std::vector<std::string> names;
      for (const auto& e : std::filesystem::directory_iterator(JoinPath(exp_dir, "checkpoints"))) {
        names.push_back(e.path().filename().string());
      }
      return names;
    };
    EXPECT_EQ(testing::DtctlJson(Dtctl({"checkpoints", run, "-o", "json"})).size(), 0u) << mode;
    if (mode == "sharded-rank-dies") {
      // The run fails with the killed rank as its cause (rank 0 is stopped with it, and may not
      // live to print); the round's directory goes on the coordinator's file work.
      EXPECT_NE(watch.exit_code, 0) << watch.output;
      EXPECT_EQ(Status(run)["failures"][0]["rank"], 1) << Status(run);
      EXPECT_TRUE(testing::WaitFor([&] { return left().empty(); }, absl::Seconds(10))) << absl::StrJoin(left(), ", ");
      continue;
    }
    ASSERT_EQ(watch.exit_code, 0) << mode << "\n" << watch.output << log0 << log1;
    EXPECT_NE(log0.find("round: not committed"), std::string::npos) << mode << "\n" << log0;
    EXPECT_NE(log0.find(why), std::string::npos) << mode << "\n" << log0;
    if (mode != "sharded-rank-raises") {
      EXPECT_NE(log1.find(why), std::string::npos) << mode << "\n" << log1;
    }
    EXPECT_NE(log0.find("latest: None"), std::string::npos) << log0;
    EXPECT_TRUE(left().empty()) << mode << ": " << absl::StrJoin(left(), ", ");
  }
}

// Files a library wrote (torch.distributed.checkpoint's names) claimed by pattern, ".metadata"
// included: the sharded round commits them with each file's rank, and verifies.
TEST_F(DtrunTest, AShardedRoundCommitsTheFilesEachRankClaimedByPattern) {
  std::string run = SubmitScript("claims", 0, {"sharded-claims"}, JoinPath(DT_SOURCE_DIR, "tests/python/dt_round.py"));
  CommandResult watch = Dtctl({"watch", run});
  std::string log0 = testing::Slurp(JoinPath(save_dir_, "claims/logs/rank-0.log"));
  ASSERT_EQ(watch.exit_code, 0) << watch.output << log0;
  EXPECT_NE(log0.find("round: committed"), std::string::npos) << log0;
  EXPECT_NE(log0.find("published: [('.metadata', 0), ('__0_0.distcp', 0), ('__0_1.distcp', 0), "
                      "('__1_0.distcp', 1), ('__1_1.distcp', 1)]"),
            std::string::npos)
      << log0;
  EXPECT_NE(log0.find("verified"), std::string::npos) << log0;
  EXPECT_NE(log0.find("claim refused: nothing in"), std::string::npos) << log0;
}

// examples/python/train_zero.py: Adam's state sharded by ZeroRedundancyOptimizer, every rank saving
// its own shard in sharded rounds. Each round is one step-S whose manifest.json names each file's
// rank; after a rank is killed the group resumes from the shards and trains exactly as a run that
// was never interrupted.
TEST_F(DtrunTest, TheZeroExampleSavesEveryRanksShardInOneRoundAndResumesExactly) {
  auto [run, exp_dir] =
      ExpectAKilledRankResumesAsTheWholeRun("zero", JoinPath(DT_SOURCE_DIR, "examples/python/train_zero.py"));
  if (HasFailure()) return;

  // One manifest per round, naming each shard's rank, the world size and the program's layout.
  nlohmann::json manifest = ShardedManifestOfTheLastRound(exp_dir);
  EXPECT_EQ(manifest["layout"]["optimizer"], "ZeroRedundancyOptimizer") << manifest;
  std::map<std::string, int> ranks;
  for (const auto& f : manifest["files"]) ranks[f["name"].get<std::string>()] = f["rank"].get<int>();
  EXPECT_EQ(ranks, (std::map<std::string, int>{{"model.pt", 0}, {"optim-0.pt", 0}, {"optim-1.pt", 1}}));
  nlohmann::json cks = testing::DtctlJson(Dtctl({"checkpoints", run, "--verify", "-o", "json"}));
  ASSERT_EQ(cks.size(), 3u) << cks;
  EXPECT_EQ(cks[2]["verified"], "ok") << cks;
  ASSERT_EQ(cks[2]["shards"].size(), 2u) << cks;
  EXPECT_EQ(cks[2]["shards"][1]["rank"], 1) << cks;
  EXPECT_EQ(cks[2]["shards"][1]["files"], 1) << cks;
  CommandResult table = Dtctl({"checkpoints", run});
  EXPECT_NE(table.output.find("2 of 2 ranks (sharded)"), std::string::npos) << table.output;
}

// examples/python/train_dcp.py: torch.distributed.checkpoint's dcp.save of DTensor shards inside a
// sharded round, each rank claiming the files DCP wrote for it (rank 0 also DCP's .metadata), and
// dcp.load of the latest round after a rank is killed. Needs a torch with DCP and DTensor (2.4 or
// later): Debian's 1.13 has neither, so the test runs where DT_TEST_TORCH2_PYTHON names such a
// Python (scripts/gpu-check.sh: the GPU machine's wheel) and is skipped elsewhere.
TEST_F(DtrunTest, DcpShardsSavedInOneRoundAndLoadedAfterAKillResumeExactly) {
  const char* torch2 = std::getenv("DT_TEST_TORCH2_PYTHON");
  const std::string python = torch2 != nullptr && *torch2 != '\0' ? torch2 : kPython;
  absl::StatusOr<CommandResult> probe = RunCommand(
      {python, "-c", "import torch.distributed.checkpoint, torch.distributed.tensor, torch.distributed.device_mesh"},
      absl::Minutes(1));
  ASSERT_TRUE(probe.ok()) << probe.status();
  if (probe->exit_code != 0) {
    GTEST_SKIP() << python << " has no torch.distributed.checkpoint with DTensor (torch >= 2.4); set "
                 << "DT_TEST_TORCH2_PYTHON to a Python that has: " << probe->output.substr(0, 300);
  }
  auto [run, exp_dir] =
      ExpectAKilledRankResumesAsTheWholeRun("dcp", JoinPath(DT_SOURCE_DIR, "examples/python/train_dcp.py"), python);
  if (HasFailure()) return;

  // One manifest for each round: DCP's files, each claimed by the rank that wrote it.
  nlohmann::json manifest = ShardedManifestOfTheLastRound(exp_dir);
  EXPECT_EQ(manifest["layout"]["format"], "torch.distributed.checkpoint") << manifest;
  std::set<int> writers;
  bool index = false;
  for (const auto& f : manifest["files"]) {
    const std::string name = f["name"].get<std::string>();
    const int rank = f["rank"].get<int>();
    writers.insert(rank);
    if (name == ".metadata") {
      index = true;
      EXPECT_EQ(rank, 0) << manifest;
    } else {
      EXPECT_TRUE(absl::StartsWith(name, absl::StrCat("__", rank, "_")) && absl::EndsWith(name, ".distcp"))
          << name << " claimed by rank " << rank << ": " << manifest;
    }
  }
  EXPECT_TRUE(index) << "no .metadata in " << manifest;
  EXPECT_EQ(writers, (std::set<int>{0, 1})) << manifest;
  nlohmann::json cks = testing::DtctlJson(Dtctl({"checkpoints", run, "--verify", "-o", "json"}));
  ASSERT_EQ(cks.size(), 3u) << cks;
  EXPECT_EQ(cks[2]["verified"], "ok") << cks;
  ASSERT_EQ(cks[2]["shards"].size(), 2u) << cks;
}

// A coordinator restart (systemd's SIGTERM, down for 7 s) does not end a program that uses the dt
// module: dt.log keeps the points and training goes on, the barrier at the end waits for the
// coordinator, and every step's loss arrives once.
TEST_F(DtrunTest, TheDtModuleRidesThroughACoordinatorRestart) {
  std::string run =
      SubmitScript("restart", 0, {"--steps", "60", "--ckpt-every", "0", "--step-sleep", "0.2"}, DtScript());
  std::string exp_dir = JoinPath(save_dir_, "restart");
  ASSERT_TRUE(testing::WaitFor([&] { return Status(run).value("step", 0) >= 5; }, absl::Minutes(2)))
      << testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  coord_.StopAndRestart(SIGTERM, absl::Seconds(7));
  CommandResult watch = Dtctl({"watch", run});
  ASSERT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(exp_dir, "logs/rank-0.log"));
  nlohmann::json s = Status(run);
  EXPECT_EQ(s["restarts"], 0) << s;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<v1::MetricRecord> loss = coord_.Metrics(run, "loss", rank);
    ASSERT_EQ(loss.size(), 60u) << "rank " << rank;
    for (int k = 0; k < 60; ++k) EXPECT_EQ(loss[k].step(), k + 1);
  }
}

// The module's errors are Python exceptions that say what is wrong: a run token used for another
// run, an unreachable coordinator, bad arguments; and outside dt it does nothing.
TEST_F(DtrunTest, TheDtModuleRaisesClearErrorsAndIsANoOpOutsideDt) {
  v1::SubmitRunResponse mine = coord_.Submit(testing::MakeSpec("mine", save_dir_, 1, 1));
  v1::SubmitRunResponse other = coord_.Submit(testing::MakeSpec("other", save_dir_, 1, 1));
  auto python = [&](const std::string& code, std::map<std::string, std::string> env) {
    env["PYTHONPATH"] = JoinPath(DT_BINARY_DIR, "../python");
    absl::StatusOr<CommandResult> r = RunCommand({kPython, "-c", code}, absl::Minutes(1), env);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->output : "";
  };
  std::map<std::string, std::string> env = {{"DT_RUN_ID", other.run_id()},
                                            {"DT_RUN_TOKEN", mine.run_token()},
                                            {"DT_COORDINATOR", coord_.address()},
                                            {"DT_GENERATION", "0"},
                                            {"DT_INCARNATION", "x"},
                                            {"RANK", "0"},
                                            {"WORLD_SIZE", "1"}};
  std::string out = python(
      "import dt\n"
      "dt.init()\n"
      "try:\n"
      "    dt.latest_checkpoint()\n"
      "except dt.DtError as e:\n"
      "    print('refused:', e.code, e)\n",
      env);
  EXPECT_NE(out.find("refused: StatusCode.PERMISSION_DENIED"), std::string::npos) << out;
  env["DT_RUN_ID"] = mine.run_id();
  env["DT_COORDINATOR"] = "127.0.0.1:1";
  out = python(
      "import dt\n"
      "dt.init()\n"
      "try:\n"
      "    dt.log({'loss': 1.0}, 1)\n"
      "except dt.CoordinatorUnavailable as e:\n"
      "    print('unavailable:', e)\n"
      "for bad in [lambda: dt.log({'a b': 1}, 1), lambda: dt.log({'loss': 'x'}, 1), lambda: dt.log({'loss': 1}, -1),\n"
      "            lambda: dt.barrier('')]:\n"
      "    try:\n"
      "        bad()\n"
      "    except ValueError as e:\n"
      "        print('ValueError:', e)\n",
      env);
  EXPECT_NE(out.find("unavailable: the coordinator at 127.0.0.1:1 is unreachable"), std::string::npos) << out;
  EXPECT_NE(out.find("ValueError: metric name 'a b' must be"), std::string::npos) << out;
  EXPECT_NE(out.find("ValueError: metric 'loss' must be a number, got 'x'"), std::string::npos) << out;
  EXPECT_NE(out.find("ValueError: step must be a non-negative int, got -1"), std::string::npos) << out;
  EXPECT_NE(out.find("ValueError: barrier name '' must be"), std::string::npos) << out;
  out = python(
      "import dt\n"
      "try:\n"
      "    dt.log({'loss': 1.0}, 1)\n"
      "except dt.NotInitialized as e:\n"
      "    print('not initialized:', e)\n"
      "print('under dt:', dt.init(), dt.experiment_dir(), dt.latest_checkpoint())\n"
      "dt.log({'loss': 1.0}, 1)\n"
      "dt.barrier('b')\n"
      "with dt.checkpoint(4) as ck:\n"
      "    print('writer:', ck.is_writer, ck.dir)\n"
      "print('should stop bare:', dt.should_stop(5), dt.stop_requested())\n",
      {{"HOME", tmp_.path()}});
  EXPECT_NE(out.find("should stop bare: False False"), std::string::npos) << out;
  EXPECT_NE(out.find("not initialized: call dt.init() first"), std::string::npos) << out;
  EXPECT_NE(out.find("under dt: False None None"), std::string::npos) << out;
  EXPECT_NE(out.find("writer: True"), std::string::npos) << out;

  // verify_checkpoint against a published manifest: whole, then with one byte changed.
  std::string ckpt = tmp_.Sub("published");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(ckpt, "state.pt"), "weights").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(ckpt, "manifest.json"),
                              absl::StrCat(R"({"step": 4, "files": [{"name": "state.pt", "size": 7, "sha256": ")",
                                           Sha256Hex("weights"), R"("}]})"))
                  .ok());
  std::string verify = absl::StrCat(
      "import dt\n"
      "try:\n"
      "    dt.verify_checkpoint('",
      ckpt,
      "')\n"
      "    print('verified')\n"
      "except dt.DtError as e:\n"
      "    print('corrupt:', e)\n");
  EXPECT_NE(python(verify, {}).find("verified"), std::string::npos);
  ASSERT_TRUE(WriteFileAtomic(JoinPath(ckpt, "state.pt"), "weighTs").ok());
  out = python(verify, {});
  EXPECT_NE(out.find("corrupt: checkpoint file " + JoinPath(ckpt, "state.pt") + " does not match its manifest"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace dt
