// Metric ingestion by one dtcoord process with Prometheus and the W&B forwarder on (W&B is the
// project's strict local server, strategy "all": every point is spooled for W&B): many streams,
// batches of 50 points of 8 values. Goal: >= 100k points/s. The time counted ends when every
// accepted batch is also delivered (Prometheus, W&B spool, watchers), read from /metrics.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/coordinator_client.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "tests/http_test_client.h"

int main() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dt;
  using namespace dt::bench;
  std::cout << "== metric ingestion: one dtcoord, Prometheus + W&B forwarder on\n";
  std::string dir = TempDir("metrics");
  std::string port_file = JoinPath(dir, "wandb.port");
  Subprocess wandb({"/usr/bin/python3", JoinPath(DT_SOURCE_DIR, "tests/wandb_server.py"), "--port-file", port_file,
                    "--api-key", "bench-key"},
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
  std::string address = ReadFile(JoinPath(state, "dtcoord.addr")).value_or("");
  address.erase(address.find_last_not_of("\n") + 1);
  std::string token = ReadFile(JoinPath(state, "admin.token")).value_or("");
  token.erase(token.find_last_not_of("\n") + 1);
  ClientOptions o;
  o.address = address;
  o.token = token;
  auto admin = *CoordinatorClient::Connect(o);
  const int ranks = 64;
  v1::SubmitRunRequest req;
  req.mutable_spec()->set_experiment_name("ingest");
  req.mutable_spec()->set_save_dir(JoinPath(dir, "runs"));
  req.mutable_spec()->set_nodes(1);
  req.mutable_spec()->set_procs_per_node(ranks);
  req.mutable_spec()->set_log_strategy(v1::ALL);
  req.mutable_spec()->mutable_wandb()->set_project("ingest-bench");
  auto run = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  if (!run.ok()) {
    std::cerr << run.status() << "\n";
    return 1;
  }
  const int streams = 16;
  absl::Duration window = Quick() ? absl::Seconds(5) : absl::Seconds(15);
  std::atomic<int64_t> accepted{0};
  std::atomic<int> failures{0};
  std::atomic<int> connected{0};
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      ClientOptions co = o;
      co.token = run->run_token();
      co.private_connection = true;
      auto client = *CoordinatorClient::Connect(co);
      if (!client->WaitConnected(absl::Seconds(20)).ok()) {
        ++failures;
        return;
      }
      ++connected;
      while (connected.load() < streams) absl::SleepFor(absl::Milliseconds(1));
      absl::Time end = absl::Now() + window;
      int64_t step = 0;
      while (absl::Now() < end) {
        auto ctx = client->Context(absl::Seconds(60));
        v1::ReportMetricsResponse resp;
        auto writer = client->metrics().ReportMetrics(ctx.get(), &resp);
        absl::Time stream_end = std::min(end, absl::Now() + absl::Seconds(1));
        while (absl::Now() < stream_end) {
          for (int r = s; r < ranks; r += streams) {
            v1::MetricBatch batch;
            batch.set_run_id(run->run_id());
            batch.set_rank(r);
            for (int i = 0; i < 50; ++i) {
              v1::MetricPoint* p = batch.add_points();
              p->set_step(step + i + 1);
              p->set_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
              for (const char* k :
                   {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "data_time_s", "epoch", "tokens_seen"}) {
                (*p->mutable_values())[k] = 1.0 + i;
              }
            }
            if (!writer->Write(batch)) break;
          }
          step += 50;
        }
        writer->WritesDone();
        grpc::Status st = writer->Finish();
        if (!st.ok()) {
          ++failures;
          std::cerr << st.error_message() << "\n";
          return;
        }
        accepted += resp.points_accepted();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Accepted means stored; delivery may trail it by up to kMaxUndeliveredMetricBatches batches.
  std::string metrics_url = absl::StrCat("http://", ReadFile(JoinPath(state, "metrics.addr")).value_or(""), "/metrics");
  metrics_url.erase(metrics_url.find('\n'), 1);
  bool delivered = false;
  for (int i = 0; i < 6000 && !delivered; ++i) {
    testing::HttpResponse r = testing::Http("GET", metrics_url);
    delivered = r.status == 200 && absl::StrContains(r.body, "\ndt_coordinator_metric_batches_unstored 0\n");
    if (!delivered) absl::SleepFor(absl::Milliseconds(10));
  }
  if (!delivered) {
    std::cerr << "accepted batches were not delivered within 60 s (" << metrics_url << ")\n";
    ++failures;
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double rate = accepted.load() / wall;
  std::cout << accepted.load() << " points accepted in " << wall << " s over " << streams << " streams, "
            << failures.load() << " failed streams\n";
  Report({"metric points ingested (Prometheus + W&B spool on)", rate, "points/s", "goal 100k points/s", 100000.0,
          ">= 1x", true, 1.0});
  coord.Signal(SIGTERM);
  coord.Wait(absl::Seconds(20));
  return failures.load() == 0 ? 0 : 1;
}
