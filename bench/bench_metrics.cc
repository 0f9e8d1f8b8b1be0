// Metric ingestion by one dtcoord process with Prometheus and the W&B forwarder on (W&B is the
// project's strict local server, strategy "all": every point is spooled for W&B): many streams,
// batches of 50 points of 8 values. Goal (#40): >= 1,000,000 points/s. The W&B server runs at
// nice 19: in production W&B is another machine's CPU, not the coordinator's. A stream ends OK only once its
// batches are also delivered (Prometheus, the W&B spool, watchers), so the time counted is the
// time to deliver what was accepted.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/coordinator_client.h"
#include "common/fs.h"
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

}  // namespace
}  // namespace dt::bench

int main() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dt;
  using namespace dt::bench;
  std::cout << "== metric ingestion: one dtcoord, Prometheus + W&B forwarder on\n";
  std::string dir = TempDir("metrics");
  std::string port_file = JoinPath(dir, "wandb.port");
  Subprocess wandb({"/usr/bin/nice", "-n", "19", "/usr/bin/python3", JoinPath(DT_SOURCE_DIR, "tests/wandb_server.py"),
                    "--port-file", port_file, "--api-key", "bench-key"},
                   {}, JoinPath(dir, "wandb.log"));
  for (int i = 0; i < 200 && ReadFile(port_file).value_or("").empty(); ++i) absl::SleepFor(absl::Milliseconds(50));
  std::string state = JoinPath(dir, "state");
  Subprocess coord({JoinPath(ExecutableDir(), "dtcoord"), "--listen", "127.0.0.1:0", "--state-dir", state,
                    "--metrics-listen", "127.0.0.1:0"},
                   {{"WANDB_API_KEY", "bench-key"},
                    {"WANDB_BASE_URL", absl::StrCat("http://127.0.0.1:", ReadFile(port_file).value_or("1"))},
                    {"DT_LOG_LEVEL", "warning"}},
                   JoinPath(dir, "dtcoord.log"));
  for (int i = 0; i < 200 && ReadFile(JoinPath(state, "dtcoord.addr")).value_or("").empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ClientOptions o;
  o.address = ReadLine(JoinPath(state, "dtcoord.addr"));
  o.token = ReadLine(JoinPath(state, "admin.token"));
  auto admin = *CoordinatorClient::Connect(o);
  v1::SubmitRunRequest req;
  req.mutable_spec()->set_experiment_name("ingest");
  req.mutable_spec()->set_save_dir(JoinPath(dir, "runs"));
  req.mutable_spec()->set_nodes(1);
  req.mutable_spec()->set_procs_per_node(kRanks);
  req.mutable_spec()->set_log_strategy(v1::ALL);
  req.mutable_spec()->mutable_wandb()->set_project("ingest-bench");
  auto run = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  if (!run.ok()) {
    std::cerr << run.status() << "\n";
    return 1;
  }
  absl::Duration window = Quick() ? absl::Seconds(5) : absl::Seconds(15);
  Totals totals;
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] { StreamBatches(o, *run, s, window, totals); });
  }
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double rate = totals.accepted.load() / wall;
  std::cout << totals.accepted.load() << " points accepted and delivered in " << wall << " s over " << kStreams
            << " streams, " << totals.failures.load() << " failed streams\n";
  Report({"metric points ingested (Prometheus + W&B spool on)", rate, "points/s", "goal 1M points/s", 1e6, ">= 1x",
          true, 1.0});
  coord.Signal(SIGTERM);
  coord.Wait(absl::Seconds(20));
  return totals.failures.load() == 0 ? 0 : 1;
}
