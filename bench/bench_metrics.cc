// Metric ingestion by one dtcoord process with Prometheus and the W&B forwarder on (W&B is the
// project's strict local server, strategy "all": every point is spooled for W&B): many streams,
// batches of 50 points of 8 values. Goal (#40): >= 1,000,000 points/s. The W&B server runs at
// nice 19: in production W&B is another machine's CPU, not the coordinator's. A stream ends OK only once its
// batches are also delivered (Prometheus, the W&B spool, watchers), so the time counted is the
// time to deliver what was accepted.
//
// `bench_metrics reporter-cost STEP_SECONDS`: what reporting every step costs a trainer. One
// MetricsReporter, in this process and nothing else, adds dttrainer's values every STEP_SECONDS;
// this process's CPU over those steps, less its CPU over as long a time without adds, per step.
// trainer_bench.py metrics-cost passes dttrainer's step time with reporting off.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/agent.h"
#include "client/coordinator_client.h"
#include "client/metrics_reporter.h"
#include "common/fs.h"
#include "common/process_tree.h"
#include "common/subprocess.h"

namespace dt::bench {
namespace {

constexpr int kRanks = 64;
constexpr int kStreams = 16;

// A batch of 50 points of 8 values for `rank`, steps after `step`, as columns (what MetricsReporter
// sends once the coordinator says it reads them).
v1::MetricBatch MakeBatch(const std::string& run_id, int rank, int64_t step) {
  v1::MetricBatch batch;
  batch.set_run_id(run_id);
  batch.set_rank(rank);
  v1::MetricColumns* c = batch.mutable_columns();
  for (const char* k :
       {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "data_time_s", "epoch", "tokens_seen"}) {
    c->add_names(k);
  }
  double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (int i = 0; i < 50; ++i) {
    c->add_steps(step + i + 1);
    c->add_times(now);
    for (int j = 0; j < c->names_size(); ++j) c->add_values(1.0 + i);
  }
  return batch;
}

struct Totals {
  std::atomic<int64_t> accepted{0};
  std::atomic<int> failures{0};
  std::atomic<int> connected{0};
};

// Stream `s`: its share of the ranks' batches, one stream per second, until `window` has passed
// since every stream connected.
void StreamBatches(ClientOptions options, const v1::SubmitRunResponse& run, int s, absl::Duration window,
                   Totals& totals) {
  options.token = run.run_token();
  options.private_connection = true;
  auto client = *CoordinatorClient::Connect(options);
  if (!client->WaitConnected(absl::Seconds(20)).ok()) {
    ++totals.failures;
    return;
  }
  ++totals.connected;
  while (totals.connected.load() < kStreams) absl::SleepFor(absl::Milliseconds(1));
  absl::Time end = absl::Now() + window;
  int64_t step = 0;
  while (absl::Now() < end) {
    auto ctx = client->Context(absl::Seconds(60));
    v1::ReportMetricsResponse resp;
    auto writer = client->metrics().ReportMetrics(ctx.get(), &resp);
    absl::Time stream_end = std::min(end, absl::Now() + absl::Seconds(1));
    while (absl::Now() < stream_end) {
      for (int r = s; r < kRanks; r += kStreams) {
        if (!writer->Write(MakeBatch(run.run_id(), r, step))) break;
      }
      step += 50;
    }
    writer->WritesDone();
    grpc::Status st = writer->Finish();
    if (!st.ok()) {
      ++totals.failures;
      std::cerr << st.error_message() << "\n";
      return;
    }
    totals.accepted += resp.points_accepted();
  }
}

// The project's W&B server (at nice 19: in production W&B is another machine's CPU) and a dtcoord
// with Prometheus and the W&B forwarder on.
struct Services {
  explicit Services(const std::string& dir)
      : port_file(JoinPath(dir, "wandb.port")),
        wandb({"/usr/bin/nice", "-n", "19", "/usr/bin/python3", JoinPath(DT_SOURCE_DIR, "tests/wandb_server.py"),
               "--port-file", port_file, "--api-key", "bench-key"},
              {}, JoinPath(dir, "wandb.log")),
        state(JoinPath(dir, "state")) {
    for (int i = 0; i < 200 && ReadFile(port_file).value_or("").empty(); ++i) absl::SleepFor(absl::Milliseconds(50));
    coord.emplace(std::vector<std::string>{JoinPath(ExecutableDir(), "dtcoord"), "--listen", "127.0.0.1:0",
                                           "--state-dir", state, "--metrics-listen", "127.0.0.1:0"},
                  std::map<std::string, std::string>{
                      {"WANDB_API_KEY", "bench-key"},
                      {"WANDB_BASE_URL", absl::StrCat("http://127.0.0.1:", ReadFile(port_file).value_or("1"))},
                      {"DT_LOG_LEVEL", "warning"}},
                  JoinPath(dir, "dtcoord.log"));
    for (int i = 0; i < 200 && ReadFile(JoinPath(state, "dtcoord.addr")).value_or("").empty(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    admin_options.address = ReadLine(JoinPath(state, "dtcoord.addr"));
    admin_options.token = ReadLine(JoinPath(state, "admin.token"));
  }
  ~Services() {
    coord->Signal(SIGTERM);
    coord->Wait(absl::Seconds(20));
  }

  // A run of `ranks` on one node, every point logged to W&B.
  absl::StatusOr<v1::SubmitRunResponse> Submit(const std::string& name, int ranks, const std::string& dir) {
    auto admin = *CoordinatorClient::Connect(admin_options);
    v1::SubmitRunRequest req;
    req.mutable_spec()->set_experiment_name(name);
    req.mutable_spec()->set_save_dir(JoinPath(dir, "runs"));
    req.mutable_spec()->set_nodes(1);
    req.mutable_spec()->set_procs_per_node(ranks);
    req.mutable_spec()->set_log_strategy(v1::ALL);
    req.mutable_spec()->mutable_wandb()->set_project(name + "-bench");
    return Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  }

  std::string port_file;
  Subprocess wandb;
  std::string state;
  std::optional<Subprocess> coord;
  ClientOptions admin_options;
};

int Ingest() {
  std::cout << "== metric ingestion: one dtcoord, Prometheus + W&B forwarder on\n";
  std::string dir = TempDir("metrics");
  Services services(dir);
  absl::StatusOr<v1::SubmitRunResponse> run = services.Submit("ingest", kRanks, dir);
  if (!run.ok()) {
    std::cerr << run.status() << "\n";
    return 1;
  }
  absl::Duration window = Quick() ? absl::Seconds(5) : absl::Seconds(15);
  Totals totals;
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] { StreamBatches(services.admin_options, *run, s, window, totals); });
  }
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double rate = totals.accepted.load() / wall;
  std::cout << totals.accepted.load() << " points accepted and delivered in " << wall << " s over " << kStreams
            << " streams, " << totals.failures.load() << " failed streams\n";
  Report({"metric points ingested (Prometheus + W&B spool on)", rate, "points/s", "goal 1M points/s", 1e6, ">= 1x",
          true, 1.0});
  return totals.failures.load() == 0 ? 0 : 1;
}

// This process's CPU over `steps` steps of `step` each, adding dttrainer's values at every step
// when `reporter` is given; the last batch delivered before the clock stops.
double CpuOverSteps(MetricsReporter* reporter, int64_t first_step, int steps, absl::Duration step) {
  double cpu0 = ProcessCpuSeconds();
  absl::Time next = absl::Now();
  for (int64_t s = first_step; s < first_step + steps; ++s) {
    next += step;
    absl::SleepFor(next - absl::Now());
    if (reporter == nullptr) continue;
    const double v = static_cast<double>(s);
    reporter->Add(s, {{"loss", 4.0 + 1 / v},
                      {"lr", 6e-4},
                      {"grad_norm", 1.5},
                      {"tokens_per_s", 1300 + v},
                      {"step_time_s", 0.19},
                      {"cpu_time_s", 0.19},
                      {"data_time_s", 0.001},
                      {"epoch", v / 100},
                      {"tokens_seen", 256 * v},
                      {"samples_seen", 4 * v},
                      {"rss_bytes", 5e8},
                      {"peak_rss_bytes", 5.1e8},
                      {"optimizer_state_bytes", 2e7}});
  }
  if (reporter != nullptr && !reporter->Flush(absl::Seconds(30)).ok()) return -1;
  return ProcessCpuSeconds() - cpu0;
}

int ReporterCost(absl::Duration step) {
  std::string dir = TempDir("reporter-cost");
  Services services(dir);
  absl::StatusOr<v1::SubmitRunResponse> run = services.Submit("reporter-cost", 1, dir);
  if (!run.ok()) {
    std::cerr << run.status() << "\n";
    return 1;
  }
  ClientOptions o = services.admin_options;
  o.token = run->run_token();
  std::shared_ptr<CoordinatorClient> client = *CoordinatorClient::Connect(o);
  AgentOptions id;
  id.run_id = run->run_id();
  id.node = id.host = "bench";
  Agent agent(client, id);
  if (absl::Status s = agent.Register(absl::Minutes(1)).status(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  MetricsReporter reporter(client, run->run_id(), agent.generation(), agent.rank());
  const int steps = Quick() ? 60 : 150;
  (void)CpuOverSteps(&reporter, 1, 5, step);  // the stream opened, the coordinator's columns answer read
  double idle = CpuOverSteps(nullptr, 0, steps, step);
  double reporting = CpuOverSteps(&reporter, 6, steps, step);
  if (reporting < 0) {
    std::cerr << "the reporter's points were not delivered\n";
    return 1;
  }
  // One line for trainer_bench.py: CPU per step with adds, without, and the difference.
  std::cout << "reporter cpu per step: " << reporting / steps << " s with, " << idle / steps << " s without, "
            << (reporting - idle) / steps << " s added\n";
  return 0;
}

}  // namespace
}  // namespace dt::bench

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dt::bench;
  if (argc == 3 && std::string(argv[1]) == "reporter-cost") {
    double step = std::atof(argv[2]);
    if (step <= 0 || step > 60) {
      std::cerr << "usage: bench_metrics reporter-cost STEP_SECONDS (a step time in (0, 60] s)\n";
      return 2;
    }
    return ReporterCost(absl::Seconds(step));
  }
  if (argc != 1) {
    std::cerr << "usage: bench_metrics [reporter-cost STEP_SECONDS]\n";
    return 2;
  }
  return Ingest();
}
