// Metrics fan-out end to end: real trainers, the dtcoord binary, a strict local W&B server
// (tests/wandb_server.py, which fails the test on any protocol deviation), Prometheus scrapes,
// promtool, and a real Prometheus server with the project's scrape config.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "tests/test_util.h"
#include "tests/wandb_test_server.h"

namespace dt {
namespace {

using testing::CoordinatorProcess;

constexpr const char* kApiKey = testing::kWandbApiKey;
using testing::WandbServer;

class MetricsE2ETest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  WandbServer wandb_{tmp_.path()};
  std::unique_ptr<CoordinatorProcess> coord_ = std::make_unique<CoordinatorProcess>(
      tmp_.path(),
      std::vector<std::string>{"--heartbeat-interval", "200ms", "--heartbeat-timeout", "10s", "--metrics-listen",
                               "127.0.0.1:0", "--wandb-post-interval", "200ms", "--wandb-retry-base", "100ms"},
      std::map<std::string, std::string>{{"WANDB_API_KEY", kApiKey}, {"WANDB_BASE_URL", wandb_.url()}});

  v1::SubmitRunResponse Submit(const std::string& name, int nodes, int procs, v1::LogStrategy strategy,
                               int max_restarts = 0) {
    v1::RunSpec spec = testing::MakeSpec(name, save_dir_, nodes, procs, max_restarts);
    spec.set_log_strategy(strategy);
    spec.mutable_wandb()->set_project("dt-tests");
    for (const char* a : {"--model", "tiny", "--dataset", "alpaca_sample.json"}) spec.add_trainer_args(a);
    return coord_->Submit(spec);
  }

  void Train(const v1::SubmitRunResponse& run, int nodes, int procs, std::vector<std::string> args) {
    auto procs_ = testing::StartTrainers(*coord_, run, nodes, procs, args, tmp_.path());
    for (size_t i = 0; i < procs_.size(); ++i) {
      int status = procs_[i]->Wait(absl::Minutes(3));
      ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << testing::Slurp(testing::TrainerLog(tmp_.path(), run, static_cast<int>(i)));
    }
  }

  // Waits until W&B holds `runs` finished runs and returns the server's state.
  nlohmann::json AwaitFinished(size_t runs) {
    nlohmann::json state;
    bool done = testing::WaitFor(
        [&] {
          state = wandb_.State();
          if (!state.is_object() || state["runs"].size() < runs) return false;
          for (auto& [k, r] : state["runs"].items()) {
            if (!r["complete"].get<bool>()) return false;
          }
          return true;
        },
        absl::Seconds(60));
    EXPECT_TRUE(done) << state.dump(1).substr(0, 4000) << testing::Slurp(coord_->log());
    return state;
  }

  static std::vector<int64_t> Steps(const nlohmann::json& run) { return testing::WandbSteps(run); }
  static std::vector<int64_t> Range(int64_t from, int64_t to) { return testing::StepRange(from, to); }
  void ExpectNoDeviations(const nlohmann::json& state) {
    EXPECT_TRUE(state["errors"].empty()) << state["errors"].dump(1);
  }
  std::string Scrape() {
    auto r =
        RunCommand({"curl", "-s", absl::StrCat("http://", coord_->metrics_address(), "/metrics")}, absl::Seconds(10));
    return r.ok() ? r->output : "";
  }
};

TEST_F(MetricsE2ETest, EachLogStrategyCreatesItsRunsWithEveryStepOnce) {
  auto main_run = Submit("wb-main", 1, 2, v1::MAIN);
  Train(main_run, 1, 2,
        {"--max-steps", "6", "--batch-size", "2", "--eval-split", "0.01", "--eval-freq", "3", "--eval-batches", "1"});
  auto all_run = Submit("wb-all", 1, 2, v1::ALL);
  Train(all_run, 1, 2, {"--max-steps", "5", "--batch-size", "2", "--eval-split", "0"});
  auto node_run = Submit("wb-node", 2, 1, v1::NODE);
  Train(node_run, 2, 1, {"--max-steps", "4", "--batch-size", "2", "--eval-split", "0"});
  nlohmann::json state = AwaitFinished(5);
  ExpectNoDeviations(state);
  ASSERT_EQ(state["runs"].size(), 5u) << state["runs"].dump(1).substr(0, 3000);

  std::string main_id = Sha1Hex(JoinPath(save_dir_, "wb-main"));
  nlohmann::json m = state["runs"]["dt-test-entity/dt-tests/" + main_id];
  ASSERT_TRUE(m.is_object()) << "no W&B run with id sha1(<save_dir>/<experiment>) = " << main_id;
  EXPECT_EQ(m["display_name"], "wb-main");
  EXPECT_EQ(Steps(m), Range(1, 6));
  EXPECT_EQ(m["exitcode"], 0);
  EXPECT_EQ(m["config"]["world_size"]["value"], 2);
  EXPECT_TRUE(m["config"].contains("_wandb"));
  std::set<std::string> tags(m["tags"].begin(), m["tags"].end());
  EXPECT_TRUE(tags.count("tiny") && tags.count("alpaca_sample.json")) << m["tags"];
  // Train and eval metrics of step 3 share one history row.
  nlohmann::json row3 = nlohmann::json::parse(m["history"][2].get<std::string>());
  EXPECT_TRUE(row3.contains("loss") && row3.contains("eval_loss")) << row3;
  for (const char* f : {"_step", "_timestamp", "_runtime"}) EXPECT_TRUE(row3.contains(f)) << f;
  EXPECT_TRUE(m["summary"].contains("loss"));

  for (int r = 0; r < 2; ++r) {
    nlohmann::json a = state["runs"][absl::StrCat("dt-test-entity/dt-tests/wb-all-", r)];
    ASSERT_TRUE(a.is_object()) << "rank " << r;
    EXPECT_EQ(a["display_name"], absl::StrCat("rank-", r));
    EXPECT_EQ(a["group"], "wb-all");
    EXPECT_EQ(Steps(a), Range(1, 5));
    nlohmann::json n = state["runs"][absl::StrCat("dt-test-entity/dt-tests/wb-node-node", r)];
    ASSERT_TRUE(n.is_object()) << "node " << r;
    EXPECT_EQ(n["display_name"], absl::StrCat("node-", r));
    EXPECT_EQ(n["group"], "wb-node");
    EXPECT_EQ(Steps(n), Range(1, 4));
  }
}

// A user's Python script under dtctl --exec: its dt.log points reach W&B (one run, every step
// once, no protocol deviation) and Prometheus like dttrainer's.
TEST_F(MetricsE2ETest, ThePythonDtModulesPointsReachW_BAndPrometheusOnce) {
  CommandResult r =
      testing::RunDtctl(*coord_,
                        {"submit", "-o", "json", "--name", "py-dt", "--save-dir", save_dir_, "--nproc-per-node", "2",
                         "--wandb-project", "dt-tests", "--exec", "--", "/usr/bin/python3",
                         JoinPath(DT_SOURCE_DIR, "examples/python/train_dt.py"), "--steps", "8", "--ckpt-every", "4"},
                        {{"HOME", tmp_.path()}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string run = testing::DtctlJson(r).value("run_id", "");
  CommandResult watch = testing::RunDtctl(*coord_, {"watch", run}, {{"HOME", tmp_.path()}});
  ASSERT_EQ(watch.exit_code, 0) << watch.output << testing::Slurp(JoinPath(save_dir_, "py-dt/logs/rank-0.log"));
  std::string scrape = Scrape();
  EXPECT_NE(scrape.find(absl::StrCat("dt_train_loss{experiment=\"py-dt\",node=")), std::string::npos) << scrape;
  EXPECT_NE(scrape.find(absl::StrCat("run=\"", run, "\"")), std::string::npos);
  nlohmann::json state = AwaitFinished(1);
  ExpectNoDeviations(state);
  nlohmann::json m = state["runs"]["dt-test-entity/dt-tests/" + Sha1Hex(JoinPath(save_dir_, "py-dt"))];
  ASSERT_TRUE(m.is_object()) << state["runs"].dump(1).substr(0, 3000);
  EXPECT_EQ(Steps(m), Range(1, 8));
  EXPECT_TRUE(nlohmann::json::parse(m["history"][0].get<std::string>()).contains("loss")) << m["history"][0];
  EXPECT_EQ(m["exitcode"], 0);
}

TEST_F(MetricsE2ETest, RateLimitsErrorsAndDroppedConnectionsStillDeliverEveryStepOnce) {
  wandb_.Inject({"429", "503", "drop", "drop-after", "500", "429"});
  auto run = Submit("wb-faults", 1, 2, v1::MAIN);
  Train(run, 1, 2, {"--max-steps", "12", "--batch-size", "2", "--eval-split", "0"});
  nlohmann::json state = AwaitFinished(1);
  ExpectNoDeviations(state);
  EXPECT_EQ(state["counts"]["faults_injected"], 6);
  nlohmann::json m = state["runs"].begin().value();
  EXPECT_EQ(Steps(m), Range(1, 12));
  EXPECT_EQ(m["exitcode"], 0);
  std::string scrape = Scrape();
  EXPECT_NE(scrape.find("dt_wandb_requests_total{code=\"429\"} 2"), std::string::npos) << scrape;
  EXPECT_NE(scrape.find("dt_wandb_requests_total{code=\"0\"}"), std::string::npos);
}

TEST_F(MetricsE2ETest, CoordinatorKilledMidRunStillDeliversEverything) {
  auto run = Submit("wb-restart", 1, 2, v1::MAIN);
  auto trainers = testing::StartTrainers(*coord_, run, 1, 2,
                                         {"--max-steps", "60", "--batch-size", "2", "--eval-split", "0"}, tmp_.path());
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        nlohmann::json s = wandb_.State();
        return s.is_object() && !s["runs"].empty() && s["runs"].begin().value()["history"].size() >= 8;
      },
      absl::Minutes(2)));
  coord_->KillAndRestart();
  for (size_t i = 0; i < trainers.size(); ++i) {
    int status = trainers[i]->Wait(absl::Minutes(3));
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << testing::Slurp(testing::TrainerLog(tmp_.path(), run, static_cast<int>(i)));
  }
  nlohmann::json state = AwaitFinished(1);
  ExpectNoDeviations(state);
  nlohmann::json m = state["runs"].begin().value();
  EXPECT_EQ(Steps(m), Range(1, 60));
  EXPECT_EQ(m["exitcode"], 0);
  EXPECT_EQ(coord_->GetRun(run.run_id()).state(), v1::SUCCEEDED);
}

TEST_F(MetricsE2ETest, AResumedExperimentContinuesTheSameW_BRunAtTheNextStep) {
  auto first = Submit("wb-resume", 1, 1, v1::MAIN);
  Train(first, 1, 1, {"--max-steps", "6", "--batch-size", "2", "--eval-split", "0"});
  nlohmann::json state = AwaitFinished(1);
  auto second = Submit("wb-resume", 1, 1, v1::MAIN);
  EXPECT_EQ(second.resume_step(), 6);
  Train(second, 1, 1, {"--max-steps", "10", "--batch-size", "2", "--eval-split", "0"});
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        state = wandb_.State();
        nlohmann::json m = state["runs"].begin().value();
        return m["complete"].get<bool>() && m["history"].size() == 10;
      },
      absl::Seconds(60)))
      << state.dump(1).substr(0, 3000);
  ExpectNoDeviations(state);
  ASSERT_EQ(state["runs"].size(), 1u);  // the same W&B run, not a second one
  nlohmann::json m = state["runs"].begin().value();
  EXPECT_EQ(Steps(m), Range(1, 10));
  EXPECT_EQ(m["upserts"], 2);
}

TEST_F(MetricsE2ETest, PrometheusSeriesDuringATwoRankRun) {
  auto run = Submit("prom", 1, 2, v1::MAIN);
  auto trainers = testing::StartTrainers(*coord_, run, 1, 2,
                                         {"--max-steps", "400", "--batch-size", "2", "--eval-split", "0"}, tmp_.path());
  std::string scrape;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        scrape = Scrape();
        return scrape.find("dt_train_loss{") != std::string::npos && scrape.find("rank=\"1\"") != std::string::npos;
      },
      absl::Minutes(2)))
      << scrape;
  for (int rank : {0, 1}) {
    std::regex series(absl::StrCat(R"(dt_train_loss\{[^}]*experiment="prom"[^}]*rank=")", rank, R"("[^}]*run=")",
                                   run.run_id(), R"("[^}]*\} [0-9.]+)"));
    EXPECT_TRUE(std::regex_search(scrape, series)) << "rank " << rank << "\n" << scrape;
  }
  for (const char* name :
       {"dt_train_learning_rate{", "dt_train_grad_norm{", "dt_train_tokens_per_second{",
        "dt_train_step_time_seconds_bucket{", "dt_train_tokens_seen_total{", "dt_train_last_step{", "dt_rank_up{",
        "dt_coordinator_registered_ranks 2", "dt_coordinator_admitted_ranks 2", "dt_coordinator_max_ranks 131072",
        "dt_coordinator_runs{state=\"RUNNING\"} 1", "dt_coordinator_rpc_duration_seconds_bucket{",
        "dt_coordinator_barrier_wait_seconds_count", "dt_metrics_points_ingested_total"}) {
    EXPECT_NE(scrape.find(name), std::string::npos) << name;
  }
  EXPECT_NE(scrape.find("node=\"n1\""), std::string::npos);
  // promtool's lint: names, units, _total on counters, no _total on gauges.
  std::string file = JoinPath(tmp_.path(), "scrape.txt");
  std::ofstream(file) << scrape;
  auto lint = RunCommand({"sh", "-c", absl::StrCat("promtool check metrics < ", file)}, absl::Seconds(30));
  ASSERT_TRUE(lint.ok());
  EXPECT_EQ(lint->exit_code, 0) << lint->output;

  // A real Prometheus with the project's scrape config, pointed at this coordinator.
  std::string config = testing::Slurp(JoinPath(DT_SOURCE_DIR, "deploy/prometheus/prometheus.yml"));
  config = absl::StrReplaceAll(config, {{"127.0.0.1:9464", coord_->metrics_address()}});
  std::string prom_dir = tmp_.Sub("prometheus");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(prom_dir, "prometheus.yml"), config).ok());
  std::filesystem::copy_file(JoinPath(DT_SOURCE_DIR, "deploy/prometheus/alerts.yml"), JoinPath(prom_dir, "alerts.yml"));
  int port = 19090 + static_cast<int>(::getpid() % 500);
  Subprocess prometheus(
      {"/usr/bin/prometheus", "--config.file=" + JoinPath(prom_dir, "prometheus.yml"),
       "--storage.tsdb.path=" + JoinPath(prom_dir, "data"), absl::StrCat("--web.listen-address=127.0.0.1:", port)},
      {}, JoinPath(prom_dir, "prometheus.log"));
  std::string result;
  bool found = testing::WaitFor(
      [&] {
        auto q = RunCommand({"curl", "-s", "-G", absl::StrCat("http://127.0.0.1:", port, "/api/v1/query"),
                             "--data-urlencode", absl::StrCat("query=dt_train_loss{run=\"", run.run_id(), "\"}")},
                            absl::Seconds(10));
        if (!q.ok()) return false;
        result = q->output;
        nlohmann::json j = nlohmann::json::parse(result, nullptr, false);
        return j.is_object() && j.value("status", "") == "success" && j["data"]["result"].size() == 2;
      },
      absl::Seconds(60));
  EXPECT_TRUE(found) << result << testing::Slurp(JoinPath(prom_dir, "prometheus.log")).substr(0, 3000);
  for (auto& t : trainers) t->Signal(SIGKILL);
}

TEST_F(MetricsE2ETest, AlertRulesCheckAndTheDashboardOnlyUsesExportedMetrics) {
  auto rules = RunCommand({"promtool", "check", "rules", JoinPath(DT_SOURCE_DIR, "deploy/prometheus/alerts.yml")},
                          absl::Seconds(30));
  ASSERT_TRUE(rules.ok());
  EXPECT_EQ(rules->exit_code, 0) << rules->output;
  // A run that checkpoints and forwards to W&B makes every family appear.
  auto run = Submit("dash", 1, 1, v1::MAIN);
  Train(run, 1, 1,
        {"--max-steps", "4", "--batch-size", "2", "--eval-split", "0.01", "--eval-freq", "2", "--eval-batches", "1",
         "--ckpt-freq", "2"});
  AwaitFinished(1);
  std::string scrape = Scrape();
  // Exported: every sample name, and every declared family (a counter with no samples yet,
  // e.g. dropped points, is still exported), histograms with their _bucket/_count/_sum.
  std::set<std::string> exported;
  std::regex sample(R"(^(dt_[a-z_]+))");
  std::regex declared(R"(^# TYPE (dt_[a-z_]+) (\w+))");
  std::istringstream lines(scrape);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, sample)) exported.insert(m[1]);
    if (std::regex_search(line, m, declared)) {
      exported.insert(m[1]);
      if (m[2] == "histogram") {
        for (const char* suffix : {"_bucket", "_count", "_sum"}) exported.insert(m[1].str() + suffix);
      }
    }
  }
  nlohmann::json dash = nlohmann::json::parse(
      testing::Slurp(JoinPath(DT_SOURCE_DIR, "deploy/grafana/dt-dashboard.json")), nullptr, false);
  ASSERT_FALSE(dash.is_discarded());
  std::string alerts = testing::Slurp(JoinPath(DT_SOURCE_DIR, "deploy/prometheus/alerts.yml"));
  std::vector<std::string> exprs;
  for (const auto& p : dash["panels"]) {
    for (const auto& t : p["targets"]) exprs.push_back(t["expr"]);
  }
  exprs.push_back(alerts);
  std::regex name(R"(dt_[a-z_]+)");
  int checked = 0;
  for (const std::string& e : exprs) {
    for (auto it = std::sregex_iterator(e.begin(), e.end(), name); it != std::sregex_iterator(); ++it) {
      std::string n = it->str();
      EXPECT_TRUE(exported.count(n)) << n << " is used but not exported";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace dt
