// Store operations and barriers: the coordinator (through the trainer's c10d::Store subclass over
// one pipelined gRPC stream per client) against c10d::TCPStore from LibTorch, in the same process
// and run.
//   Store: set/get/add p50/p99 and throughput with 1, 8, 64 clients, each with its own connection.
//   Barriers: last arrival to release for 2, 8, 64, 256 participants; the TCPStore barrier is
//   add + wait, as torch does it.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "client/agent.h"
#include "client/store_session.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "coordinator/embedded.h"
#include "trainer/coordinator_store.h"

namespace dt::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

struct OpStats {
  std::vector<double> set, get, add;
  double ops_per_s = 0;
};

// Runs the workload on `clients` stores (one per thread): set, get, add per iteration.
OpStats RunOps(std::vector<c10::intrusive_ptr<c10d::Store>>& stores, int iterations) {
  const int clients = static_cast<int>(stores.size());
  std::vector<OpStats> per(clients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  Clock::time_point start, end;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      c10d::Store& store = *stores[c];
      std::vector<uint8_t> value(64, 'v');
      // Warm up the connection.
      store.set(absl::StrCat("warm-", c), value);
      ++ready;
      while (!go.load()) std::this_thread::yield();
      OpStats& s = per[c];
      s.set.reserve(iterations);
      for (int i = 0; i < iterations; ++i) {
        std::string key = absl::StrCat("c", c, "-k", i % 64);
        auto t0 = Clock::now();
        store.set(key, value);
        auto t1 = Clock::now();
        (void)store.get(key);
        auto t2 = Clock::now();
        (void)store.add(absl::StrCat("ctr-", c), 1);
        auto t3 = Clock::now();
        s.set.push_back(Micros(t1 - t0));
        s.get.push_back(Micros(t2 - t1));
        s.add.push_back(Micros(t3 - t2));
      }
    });
  }
  while (ready.load() < clients) std::this_thread::yield();
  start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  end = Clock::now();
  OpStats all;
  for (auto& s : per) {
    all.set.insert(all.set.end(), s.set.begin(), s.set.end());
    all.get.insert(all.get.end(), s.get.begin(), s.get.end());
    all.add.insert(all.add.end(), s.add.begin(), s.add.end());
  }
  all.ops_per_s = 3.0 * clients * iterations / std::chrono::duration<double>(end - start).count();
  return all;
}

// The TCPStore server lives in this process, as the coordinator does; clients connect to its port.
c10::intrusive_ptr<c10d::TCPStore> StartTcpStoreServer() {
  c10d::TCPStoreOptions server_opts;
  server_opts.port = 0;
  server_opts.isServer = true;
  server_opts.waitWorkers = false;
  server_opts.multiTenant = true;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_opts);
}

void StoreBench(EmbeddedCoordinator& coord, const std::string& run_id, const std::string& token) {
  auto server = StartTcpStoreServer();
  uint16_t port = server->getPort();

  for (int clients : Quick() ? std::vector<int>{1, 8, 64} : std::vector<int>{1, 8, 64}) {
    int iterations = (Quick() ? 600 : 3000) / std::max(1, clients / 8);
    std::vector<c10::intrusive_ptr<c10d::Store>> dt_stores, tcp_stores;
    for (int c = 0; c < clients; ++c) {
      auto client = coord.Client(token, /*private_connection=*/true);
      auto session = StoreSession::Open(client, run_id, 0, -1);
      if (!session.ok()) throw std::runtime_error(session.status().ToString());
      dt_stores.push_back(c10::make_intrusive<CoordinatorStore>(std::move(*session), std::chrono::seconds(60)));
      c10d::TCPStoreOptions o;
      o.port = port;
      o.isServer = false;
      o.waitWorkers = false;
      tcp_stores.push_back(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
    }
    // Interleave repeats so both see the same machine noise; keep the best median.
    OpStats dt_best, tcp_best;
    int repeats = Quick() ? 2 : 3;
    for (int r = 0; r < repeats; ++r) {
      OpStats d = RunOps(dt_stores, iterations);
      OpStats t = RunOps(tcp_stores, iterations);
      if (r == 0 || Summarize(d.get).p50 < Summarize(dt_best.get).p50) dt_best = d;
      if (r == 0 || Summarize(t.get).p50 < Summarize(tcp_best.get).p50) tcp_best = t;
    }
    std::string who = absl::StrCat(clients, " client", clients == 1 ? "" : "s");
    for (auto [op, dt_v, tcp_v] : {std::tuple{"get", &dt_best.get, &tcp_best.get},
                                   std::tuple{"add", &dt_best.add, &tcp_best.add},
                                   std::tuple{"set", &dt_best.set, &tcp_best.set}}) {
      Summary d = Summarize(*dt_v), t = Summarize(*tcp_v);
      bool goal = std::string(op) != "set";
      Report({absl::StrCat("store ", op, " p50, ", who), d.p50, "us", "TCPStore", t.p50,
              goal ? "<= 1.5x" : "", false, goal ? 1.5 : 0});
      Report({absl::StrCat("store ", op, " p99, ", who), d.p99, "us", "TCPStore", t.p99, "", false, 0});
    }
    Report({absl::StrCat("store throughput, ", who), dt_best.ops_per_s, "ops/s", "TCPStore", tcp_best.ops_per_s,
            clients == 64 ? ">= 1x" : "", true, clients == 64 ? 1.0 : 0});
  }
}

// Last arrival → release, per round, for `n` participants.
template <typename ArriveFn>
std::vector<double> BarrierRounds(int n, int rounds, ArriveFn arrive) {
  std::vector<std::vector<Clock::time_point>> arrived(rounds, std::vector<Clock::time_point>(n));
  std::vector<std::vector<Clock::time_point>> released(rounds, std::vector<Clock::time_point>(n));
  absl::Barrier* start = new absl::Barrier(n);
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p) {
    threads.emplace_back([&, p] {
      if (start->Block()) delete start;
      for (int r = 0; r < rounds; ++r) {
        // Stagger arrivals a little so the last one is a real straggler.
        std::this_thread::sleep_for(std::chrono::microseconds((p * 37 + r * 11) % 200));
        arrived[r][p] = Clock::now();
        arrive(p, r);
        released[r][p] = Clock::now();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> out;
  for (int r = 0; r < rounds; ++r) {
    auto last_arrival = *std::max_element(arrived[r].begin(), arrived[r].end());
    auto last_release = *std::max_element(released[r].begin(), released[r].end());
    out.push_back(Micros(last_release - last_arrival) / 1000.0);
  }
  return out;
}

void BarrierBench(EmbeddedCoordinator& coord) {
  auto server = StartTcpStoreServer();
  uint16_t port = server->getPort();
  std::vector<int> sizes = Quick() ? std::vector<int>{2, 8, 64} : std::vector<int>{2, 8, 64, 256};
  for (int n : sizes) {
    int rounds = Quick() ? 10 : (n >= 64 ? 20 : 40);
    // The coordinator: a run of n ranks, each an Agent with its own connection.
    v1::SubmitRunRequest req;
    v1::RunSpec* spec = req.mutable_spec();
    spec->set_experiment_name(absl::StrCat("barrier-", n, "-", RandomHex(3)));
    spec->set_save_dir(TempDir("barrier"));
    spec->set_nodes(1);
    spec->set_procs_per_node(n);
    auto admin = coord.AdminClient();
    auto run = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
    if (!run.ok()) throw std::runtime_error(run.status().ToString());
    std::vector<std::unique_ptr<Agent>> agents;
    for (int p = 0; p < n; ++p) {
      AgentOptions o;
      o.run_id = run->run_id();
      o.node = "bench";
      o.local_slot = p;
      o.host = "bench";
      agents.push_back(std::make_unique<Agent>(coord.Client(run->run_token(), true), o));
    }
    std::vector<std::thread> reg;
    for (auto& a : agents) reg.emplace_back([&a] { (void)a->Register(absl::Minutes(2)); });
    for (auto& t : reg) t.join();
    std::vector<Agent*> by_rank(n);
    for (auto& a : agents) by_rank[a->rank()] = a.get();
    auto dt_rounds = BarrierRounds(n, rounds, [&](int p, int r) {
      absl::Status s = by_rank[p]->Barrier("bench", absl::Seconds(60));
      if (!s.ok()) throw std::runtime_error(s.ToString());
    });
    // TCPStore: add + wait on a "done" key set by the last arrival (torch's store barrier).
    std::vector<c10::intrusive_ptr<c10d::TCPStore>> stores;
    for (int p = 0; p < n; ++p) {
      c10d::TCPStoreOptions o;
      o.port = port;
      o.waitWorkers = false;
      stores.push_back(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
    }
    std::string tag = RandomHex(3);
    auto tcp_rounds = BarrierRounds(n, rounds, [&](int p, int r) {
      std::string key = absl::StrCat("barrier-", tag, "-", r);
      if (stores[p]->add(key, 1) == n) stores[p]->set(key + "/done", Bytes("1"));
      stores[p]->wait({key + "/done"});
    });
    Summary d = Summarize(dt_rounds), t = Summarize(tcp_rounds);
    Report({absl::StrCat("barrier release, ", n, " participants (p50)"), d.p50, "ms", "TCPStore add+wait", t.p50,
            n >= 64 ? "<= 1x" : "", false, n >= 64 ? 1.0 : 0});
    Report({absl::StrCat("barrier release, ", n, " participants (p90)"), d.p90, "ms", "TCPStore add+wait", t.p90, "",
            false, 0});
  }
}

}  // namespace
}  // namespace dt::bench

int main() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dt::bench;
  std::cout << "== store operations and barriers: dt coordinator vs c10d::TCPStore (same process, loopback)\n";
  dt::EmbeddedOptions opts;
  opts.timeouts.heartbeat_timeout = absl::Hours(1);  // the benchmark's agents do not heartbeat
  opts.timeouts.hang_timeout = absl::Hours(2);
  dt::EmbeddedCoordinator coord(TempDir("store-coord"), opts);
  auto admin = coord.AdminClient();
  dt::v1::SubmitRunRequest req;
  req.mutable_spec()->set_experiment_name("store-bench");
  req.mutable_spec()->set_save_dir(TempDir("store-runs"));
  req.mutable_spec()->set_nodes(1);
  req.mutable_spec()->set_procs_per_node(1);
  auto run = dt::Call(*admin, &dt::v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  if (!run.ok()) {
    std::cerr << run.status() << "\n";
    return 1;
  }
  StoreBench(coord, run->run_id(), run->run_token());
  BarrierBench(coord);
  return 0;
}
