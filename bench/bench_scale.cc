// Scale of one dtcoord process (the real binary):
//   Storm: 512 admitted ranks heartbeat every 2 s while 8 clients submit runs past --max-ranks;
//   every submission is refused; goal: heartbeat p99 < 50 ms.
//   Rendezvous: 64, 512 and 2,048 simulated ranks, each with its own connection, register; time
//   until every one holds its assignment. Goal: 512 ranks < 1 s.
//   Heartbeat load: 1,000 registered ranks heartbeat every 2 s (own connections) while 8 clients
//   drive store traffic (~800 set/get per second in all); the coordinator's CPU share and the
//   heartbeat RPC p99. Goals: p99 < 50 ms, CPU < 25% of one core.
//   Mixed load: one run of 1,000 ranks and 50 runs of 8 (1,400 ranks, each its own connection)
//   heartbeating every 2 s and sending a metric batch every second, with store traffic in every
//   run, for 2 minutes (20 s quick): each method's p50/p99 as the ranks see it, errors, and
//   dtcoord's CPU and memory. The simulated ranks share this machine's two cores with dtcoord.
//   Node agents: 1K, 8K, 32K and 98,304 ranks, 8 to a node, one connection and one RegisterNode
//   per node (as each node's dtrun would send), then every node heartbeating every 2 s, first with
//   a NodeHeartbeat call each, then on its NodeHeartbeats stream (answered each time, then only on
//   change, as dtrun asks), then one barrier of every rank (two store sessions per node, as the
//   node relay sends it). Goals at 98,304: registered in 10 s, heartbeats cost <= 50% of a core,
//   the barrier released within 1 s of the last arrival, peak RSS <= 2 GiB. The simulator shares
//   one process (and its gRPC threads) for every node, on this machine's cores beside dtcoord.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/coordinator_client.h"
#include "client/store_session.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/subprocess.h"

namespace dt::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Coordinator {
  std::unique_ptr<Subprocess> process;
  std::string address, token;
  int pid() const { return process->pid(); }
};

// `metrics_listen`: "off", or an address for the Prometheus exporter (whose cost is then counted).
Coordinator StartCoordinator(const std::string& dir, const std::string& metrics_listen = "off",
                             const std::vector<std::string>& extra_args = {}) {
  Coordinator c;
  std::string state = JoinPath(dir, "state");
  std::vector<std::string> argv = {JoinPath(ExecutableDir(), "dtcoord"),
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--state-dir",
                                   state,
                                   "--metrics-listen",
                                   metrics_listen,
                                   "--heartbeat-interval",
                                   "2s",
                                   "--heartbeat-timeout",
                                   "60s",
                                   "--hang-timeout",
                                   "30m",
                                   "--rendezvous-timeout",
                                   "10m"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  c.process = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{{"DT_LOG_LEVEL", "warning"}},
                                           JoinPath(dir, "dtcoord.log"));
  for (int i = 0; i < 200 && ReadFile(JoinPath(state, "dtcoord.addr")).value_or("").empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  c.address = ReadLine(JoinPath(state, "dtcoord.addr"));
  c.token = ReadLine(JoinPath(state, "admin.token"));
  if (c.address.empty()) throw std::runtime_error("dtcoord did not start");
  return c;
}

// A client with the admin token, or `token` (a run's).
std::shared_ptr<CoordinatorClient> Connect(const Coordinator& c, bool private_connection,
                                           const std::string& token = "") {
  ClientOptions o;
  o.address = c.address;
  o.token = token.empty() ? c.token : token;
  o.private_connection = private_connection;
  return *CoordinatorClient::Connect(o);
}

// A run of nodes x ppn ranks in `dir`, under a fresh name.
v1::SubmitRunRequest SubmitRequest(int nodes, int ppn, const std::string& dir) {
  v1::SubmitRunRequest req;
  req.mutable_spec()->set_experiment_name(absl::StrCat("scale-", nodes * ppn, "-", RandomHex(4)));
  req.mutable_spec()->set_save_dir(dir);
  req.mutable_spec()->set_nodes(nodes);
  req.mutable_spec()->set_procs_per_node(ppn);
  return req;
}

v1::SubmitRunResponse Submit(const Coordinator& c, int nodes, int ppn, const std::string& dir) {
  auto admin = Connect(c, false);
  auto r =
      Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), SubmitRequest(nodes, ppn, dir), absl::Seconds(30));
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return *r;
}

double CpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stol(f);
    if (i == 15) stime = std::stol(f);
  }
  return static_cast<double>(utime + stime) / ::sysconf(_SC_CLK_TCK);
}

// Registers `ranks` simulated ranks (ppn per node) with asynchronous calls, each on its own
// connection; returns the ranks' clients (kept for heartbeats) and the time until all hold seats.
struct Registered {
  std::vector<std::shared_ptr<CoordinatorClient>> clients;
  std::vector<v1::RegisterResponse> seats;
  std::vector<std::string> incarnations;
  double seconds = 0;
};

Registered RegisterAll(const Coordinator& c, const v1::SubmitRunResponse& run, int nodes, int ppn) {
  int n = nodes * ppn;
  Registered out;
  out.seats.resize(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::RegisterRequest> requests(n);
  for (int i = 0; i < n; ++i) {
    out.clients.push_back(Connect(c, true, run.run_token()));
    (void)out.clients.back()->WaitConnected(absl::Seconds(30));
    requests[i].set_run_id(run.run_id());
    requests[i].set_node(absl::StrCat("node", i / ppn));
    requests[i].set_local_slot(i % ppn);
    requests[i].set_incarnation(RandomHex(6));
    requests[i].set_host("bench");
    requests[i].set_pid(1);
    out.incarnations.push_back(requests[i].incarnation());
    contexts.push_back(out.clients[i]->Context(absl::Minutes(5)));
  }
  std::atomic<int> done{0};
  std::atomic<int> failed{0};
  absl::Notification all;
  auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    out.clients[i]->rendezvous().async()->Register(contexts[i].get(), &requests[i], &out.seats[i], [&](grpc::Status s) {
      if (!s.ok()) ++failed;
      if (++done == n) all.Notify();
    });
  }
  all.WaitForNotification();
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed > 0) throw std::runtime_error(absl::StrCat(failed.load(), " registrations failed"));
  return out;
}

void RendezvousBench(const std::string& dir) {
  std::vector<std::pair<int, int>> shapes = {{8, 8}, {64, 8}, {256, 8}};
  if (Quick()) shapes = {{8, 8}, {64, 8}};
  for (auto [nodes, ppn] : shapes) {
    Coordinator c = StartCoordinator(TempDir("rdzv"));
    v1::SubmitRunResponse run = Submit(c, nodes, ppn, dir);
    Registered r = RegisterAll(c, run, nodes, ppn);
    int n = nodes * ppn;
    bool goal = n == 512;
    Report({absl::StrCat("rendezvous of ", n, " ranks (own connections)"), r.seconds, "s", "goal 1 s", 1.0,
            goal ? "< 1x" : "", false, goal ? 1.0 : 0});
  }
}

template <typename Request, typename Response>
using AsyncRendezvousCall = void (v1::RendezvousService::Stub::async::*)(grpc::ClientContext*, const Request*,
                                                                         Response*, std::function<void(grpc::Status)>);

// One asynchronous RendezvousService call; `done` gets its latency and whether it went well
// (`ok` judges the answer). `in_flight` counts it until then (the caller waits for zero before it
// tears the clients down).
template <typename Request, typename Response>
void SendAsync(CoordinatorClient& client, AsyncRendezvousCall<Request, Response> method, const Request& req,
               std::function<bool(const Response&)> ok, std::atomic<int>& in_flight,
               std::function<void(double ms, bool ok)> done) {
  auto* ctx = client.Context(absl::Seconds(10)).release();
  auto* resp = new Response();
  auto t0 = Clock::now();
  ++in_flight;
  (client.rendezvous().async()->*method)(ctx, &req, resp, [&in_flight, ok, done, ctx, resp, t0](grpc::Status s) {
    done(std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), s.ok() && ok(*resp));
    delete ctx;
    delete resp;
    --in_flight;
  });
}

// One asynchronous heartbeat; ok when the rank may go on.
void SendHeartbeat(CoordinatorClient& client, const v1::HeartbeatRequest& req, std::atomic<int>& in_flight,
                   std::function<void(double ms, bool ok)> done) {
  SendAsync<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      client, &v1::RendezvousService::Stub::async::Heartbeat, req,
      [](const v1::HeartbeatResponse& r) { return r.directive() == v1::HeartbeatResponse::CONTINUE; }, in_flight,
      std::move(done));
}

// One asynchronous node heartbeat; ok when every rank may go on.
void SendNodeHeartbeat(CoordinatorClient& client, const v1::NodeHeartbeatRequest& req, std::atomic<int>& in_flight,
                       std::function<void(double ms, bool ok)> done) {
  SendAsync<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>(
      client, &v1::RendezvousService::Stub::async::NodeHeartbeat, req,
      [n = req.ranks_size()](const v1::NodeHeartbeatResponse& r) {
        if (r.ranks_size() != n) return false;
        for (const auto& answer : r.ranks()) {
          if (answer.code() != 0 || answer.reply().directive() != v1::HeartbeatResponse::CONTINUE) return false;
        }
        return true;
      },
      in_flight, std::move(done));
}

// Sends `count` calls evenly over each `interval` for `window` (call i % count at its time),
// one scheduler thread issuing asynchronous calls; returns how many went out.
int64_t Paced(int count, absl::Duration interval, absl::Duration window,
              const std::function<void(int i, int64_t round)>& send) {
  absl::Time start = absl::Now();
  int64_t sent = 0;
  while (absl::Now() - start < window) {
    absl::Time due = start + interval * (static_cast<double>(sent) / count);
    if (absl::Now() < due) {
      absl::SleepFor(due - absl::Now());
      continue;
    }
    send(static_cast<int>(sent % count), sent / count);
    ++sent;
  }
  return sent;
}

void HeartbeatBench(const std::string& dir) {
  const int nodes = 10, ppn = 100, n = nodes * ppn;
  Coordinator c = StartCoordinator(TempDir("hb"));
  v1::SubmitRunResponse run = Submit(c, nodes, ppn, dir);
  Registered r = RegisterAll(c, run, nodes, ppn);
  absl::Duration window = Quick() ? absl::Seconds(10) : absl::Seconds(30);
  absl::Duration interval = absl::Seconds(2);
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::vector<double> latencies_ms;
  std::atomic<int64_t> store_ops{0};
  std::atomic<int> errors{0};
  // Store traffic beside the heartbeats.
  std::vector<std::thread> store_threads;
  for (int t = 0; t < 8; ++t) {
    store_threads.emplace_back([&, t] {
      auto session = StoreSession::Open(Connect(c, true), run.run_id(), 0, -1);
      if (!session.ok()) return;
      while (!stop) {
        std::string key = absl::StrCat("k", t, "-", store_ops.load() % 100);
        (void)(*session)->Set(key, std::string(128, 'x'));
        (void)(*session)->Get(key);
        store_ops += 2;
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  double cpu0 = CpuSeconds(c.pid());
  absl::Time start = absl::Now();
  // One scheduler issues each rank's heartbeat every 2 s, spread evenly, as asynchronous calls.
  std::vector<v1::HeartbeatRequest> reqs(n);
  for (int i = 0; i < n; ++i) {
    reqs[i].set_run_id(run.run_id());
    reqs[i].set_rank(r.seats[i].rank());
    reqs[i].set_generation(0);
    reqs[i].set_incarnation(r.incarnations[i]);
  }
  std::atomic<int> in_flight{0};
  int64_t sent = Paced(n, interval, window, [&](int i, int64_t round) {
    reqs[i].set_step(round + 1);
    SendHeartbeat(*r.clients[i], reqs[i], in_flight, [&](double ms, bool ok) {
      if (!ok) ++errors;
      absl::MutexLock lock(&mu);
      latencies_ms.push_back(ms);
    });
  });
  double wall = absl::ToDoubleSeconds(absl::Now() - start);
  double cpu = CpuSeconds(c.pid()) - cpu0;
  stop = true;
  for (auto& t : store_threads) t.join();
  while (in_flight.load() > 0) absl::SleepFor(absl::Milliseconds(10));
  Summary s;
  {
    absl::MutexLock lock(&mu);
    s = Summarize(latencies_ms);
  }
  std::cout << "heartbeats: " << sent << " sent (" << sent / wall << "/s), " << errors.load() << " errors; store ops "
            << store_ops.load() / wall << "/s\n";
  Report({absl::StrCat("heartbeat RPC p99, ", n, " ranks every 2 s + store traffic"), s.p99, "ms", "goal 50 ms", 50.0,
          "< 1x", false, 1.0});
  Report({absl::StrCat("coordinator CPU, ", n, " ranks heartbeating"), 100.0 * cpu / wall, "% core", "goal 25%", 25.0,
          "< 1x", false, 1.0});
  if (errors.load() > 0) std::cout << "WARNING: " << errors.load() << " heartbeats failed or were told to stop\n";
}

// A resident-set figure of a process from /proc (VmRSS, VmHWM), in MiB.
double MemoryMiB(int pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, field + ":")) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return 0;
}

// Latencies of one kind of call, and its failures.
struct Calls {
  absl::Mutex mu;
  std::vector<double> ms ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> errors{0};
  void Add(double v) {
    absl::MutexLock lock(&mu);
    ms.push_back(v);
  }
  Summary Take() {
    absl::MutexLock lock(&mu);
    return Summarize(ms);
  }
};

// Every simulated rank of the load: its run, its seat and its connection.
struct LoadRank {
  std::string run_id;
  std::shared_ptr<CoordinatorClient> client;
  v1::RegisterResponse seat;
  std::string incarnation;
};

// Appends the registered ranks of `run` to `ranks`.
void AddLoadRanks(const v1::SubmitRunResponse& run, const Registered& r, std::vector<LoadRank>& ranks) {
  for (size_t i = 0; i < r.clients.size(); ++i)
    ranks.push_back({run.run_id(), r.clients[i], r.seats[i], r.incarnations[i]});
}

std::vector<LoadRank> RegisterLoad(const Coordinator& c, const std::string& dir, std::vector<std::string>* run_ids) {
  std::vector<LoadRank> ranks;
  std::vector<std::pair<int, int>> shapes = {{125, 8}};  // 1,000 ranks
  for (int i = 0; i < 50; ++i) shapes.push_back({1, 8});
  for (auto [nodes, ppn] : shapes) {
    v1::SubmitRunResponse run = Submit(c, nodes, ppn, dir);
    run_ids->push_back(run.run_id());
    AddLoadRanks(run, RegisterAll(c, run, nodes, ppn), ranks);
  }
  return ranks;
}

// One metric batch of `rank` for `step`, sent as the trainers' reporter sends one.
void SendBatch(const LoadRank& rank, int64_t step, Calls& calls) {
  v1::MetricBatch batch;
  batch.set_run_id(rank.run_id);
  batch.set_generation(0);
  batch.set_rank(rank.seat.rank());
  v1::MetricPoint* p = batch.add_points();
  p->set_step(step);
  p->set_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  for (const char* name : {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "data_time_s"}) {
    (*p->mutable_values())[name] = 1.0 / static_cast<double>(step);
  }
  auto t0 = Clock::now();
  std::unique_ptr<grpc::ClientContext> ctx = rank.client->Context(absl::Seconds(10));
  v1::ReportMetricsResponse response;
  auto writer = rank.client->metrics().ReportMetrics(ctx.get(), &response);
  bool ok = writer->Write(batch);
  writer->WritesDone();
  ok = writer->Finish().ok() && ok;
  calls.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  if (!ok) ++calls.errors;
}

// Heartbeats for `window`: every rank every 2 s, spread evenly, asynchronous. Returns when every
// answer is in (the requests and `heartbeats` must outlive the calls).
void SendHeartbeatsFor(const std::vector<LoadRank>& ranks, absl::Duration window, Calls& heartbeats) {
  const int n = static_cast<int>(ranks.size());
  std::vector<v1::HeartbeatRequest> reqs(n);
  for (int i = 0; i < n; ++i) {
    reqs[i].set_run_id(ranks[i].run_id);
    reqs[i].set_rank(ranks[i].seat.rank());
    reqs[i].set_incarnation(ranks[i].incarnation);
  }
  std::atomic<int> in_flight{0};
  Paced(n, absl::Seconds(2), window, [&](int i, int64_t round) {
    reqs[i].set_step(round + 1);
    SendHeartbeat(*ranks[i].client, reqs[i], in_flight, [&heartbeats](double ms, bool ok) {
      heartbeats.Add(ms);
      if (!ok) ++heartbeats.errors;
    });
  });
  while (in_flight.load() > 0) absl::SleepFor(absl::Milliseconds(10));
}

// ---- Node agents: one connection and one registration per node of 8 ranks -------------------

// `nodes` node agents registered with RegisterNode, each on its own connection (as each node's
// dtrun would hold one); the time until every agent held its seats, and dtcoord's CPU meanwhile.
struct NodeAgents {
  std::vector<std::shared_ptr<CoordinatorClient>> clients;
  std::vector<v1::RegisterNodeResponse> seats;
  std::vector<v1::RegisterNodeRequest> requests;
  double seconds = 0;
  double cpu_seconds = 0;
};

NodeAgents RegisterNodes(const Coordinator& c, const v1::SubmitRunResponse& run, int nodes, int ppn) {
  NodeAgents out;
  out.seats.resize(nodes);
  out.requests.resize(nodes);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int i = 0; i < nodes; ++i) {
    out.clients.push_back(Connect(c, true, run.run_token()));
    (void)out.clients.back()->WaitConnected(absl::Seconds(30));
    v1::RegisterNodeRequest& req = out.requests[i];
    req.set_run_id(run.run_id());
    req.set_node(absl::StrCat("node", i));
    req.set_host(absl::StrCat("host", i));
    for (int s = 0; s < ppn; ++s) {
      v1::NodeSlot& slot = *req.add_slots();
      slot.set_local_slot(s);
      slot.set_incarnation(RandomHex(6));
      slot.set_pid(1000 + s);
    }
    contexts.push_back(out.clients[i]->Context(absl::Minutes(5)));
  }
  std::atomic<int> done{0}, failed{0};
  absl::Notification all;
  double cpu0 = CpuSeconds(c.pid());
  auto start = Clock::now();
  for (int i = 0; i < nodes; ++i) {
    out.clients[i]->rendezvous().async()->RegisterNode(contexts[i].get(), &out.requests[i], &out.seats[i],
                                                       [&](grpc::Status s) {
                                                         if (!s.ok()) ++failed;
                                                         if (++done == nodes) all.Notify();
                                                       });
  }
  all.WaitForNotification();
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.cpu_seconds = CpuSeconds(c.pid()) - cpu0;
  if (failed > 0) throw std::runtime_error(absl::StrCat(failed.load(), " node registrations failed"));
  return out;
}

// Every node heartbeats its ranks every 2 s (one NodeHeartbeat per node), spread evenly, for
// `window`; dtcoord's CPU share meanwhile.
// Each node's heartbeat of its ranks (steps set when sent).
std::vector<v1::NodeHeartbeatRequest> NodeHeartbeatRequests(const NodeAgents& agents) {
  std::vector<v1::NodeHeartbeatRequest> reqs(agents.requests.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].set_run_id(agents.requests[i].run_id());
    for (int s = 0; s < agents.requests[i].slots_size(); ++s) {
      v1::RankHeartbeat& beat = *reqs[i].add_ranks();
      beat.set_rank(agents.seats[i].slots(s).rank());
      beat.set_incarnation(agents.requests[i].slots(s).incarnation());
    }
  }
  return reqs;
}

double NodeHeartbeatsFor(const Coordinator& c, const NodeAgents& agents, absl::Duration window, Calls& calls) {
  const int nodes = static_cast<int>(agents.clients.size());
  std::vector<v1::NodeHeartbeatRequest> reqs = NodeHeartbeatRequests(agents);
  std::atomic<int> in_flight{0};
  double cpu0 = CpuSeconds(c.pid());
  absl::Time start = absl::Now();
  Paced(nodes, absl::Seconds(2), window, [&](int i, int64_t round) {
    for (v1::RankHeartbeat& beat : *reqs[i].mutable_ranks()) beat.set_step(round + 1);
    SendNodeHeartbeat(*agents.clients[i], reqs[i], in_flight, [&calls](double ms, bool ok) {
      calls.Add(ms);
      if (!ok) ++calls.errors;
    });
  });
  double share = (CpuSeconds(c.pid()) - cpu0) / absl::ToDoubleSeconds(absl::Now() - start);
  while (in_flight.load() > 0) absl::SleepFor(absl::Milliseconds(10));
  return share;
}

// One node agent's heartbeat stream (RendezvousService.NodeHeartbeats): a heartbeat is written
// and its answer read before the next; one due while the last is unanswered counts as failed.
// With `changes_only` (NodeHeartbeatRequest.answer_changes_only) only the first heartbeat is
// answered and a later one is done once written; a read then waits for any other answer, which
// counts as failed (nothing changes for the ranks here).
class HeartbeatStream final : public grpc::ClientBidiReactor<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse> {
 public:
  HeartbeatStream(CoordinatorClient& client, Calls& calls, bool changes_only)
      : calls_(calls), changes_only_(changes_only), context_(client.Context(absl::InfiniteDuration())) {
    client.rendezvous().async()->NodeHeartbeats(context_.get(), this);
    StartCall();
  }

  void Beat(const v1::NodeHeartbeatRequest& request) {
    {
      absl::MutexLock lock(&mu_);
      if (busy_ || ended_) {
        ++calls_.errors;
        return;
      }
      busy_ = true;
      request_ = request;
      request_.set_answer_changes_only(changes_only_);
      sent_at_ = Clock::now();
    }
    StartWrite(&request_);
  }

  // Closes the stream once its last heartbeat is answered and waits for its end; false when it
  // ended with an error.
  bool Close() {
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](bool* busy) { return !*busy; }, &busy_));
      ended = ended_;
    }
    if (!ended) StartWritesDone();
    done_.WaitForNotification();
    return status_.ok();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Answered(false);
    } else if (changes_only_ && first_answered_) {
      Answered(true);  // not to be answered; the read for a change is pending
    } else {
      StartRead(&response_);
    }
  }
  void OnReadDone(bool ok) override {
    if (changes_only_ && first_answered_) {
      if (!ok) return;  // the stream ended
      ++calls_.errors;  // an answer although nothing changed
      StartRead(&response_);
      return;
    }
    bool right = ok && response_.ranks_size() == request_.ranks_size();
    for (const auto& answer : response_.ranks()) {
      right = right && answer.code() == 0 && answer.reply().directive() == v1::HeartbeatResponse::CONTINUE;
    }
    if (changes_only_ && ok) {
      first_answered_ = true;
      StartRead(&response_);
    }
    Answered(right);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      busy_ = false;
    }
    done_.Notify();
  }

 private:
  void Answered(bool right) {
    calls_.Add(std::chrono::duration<double, std::milli>(Clock::now() - sent_at_).count());
    if (!right) ++calls_.errors;
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }

  Calls& calls_;
  const bool changes_only_;
  std::atomic<bool> first_answered_{false};
  std::unique_ptr<grpc::ClientContext> context_;
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  v1::NodeHeartbeatRequest request_;
  v1::NodeHeartbeatResponse response_;
  Clock::time_point sent_at_;
  grpc::Status status_;
  absl::Notification done_;
};

// The node heartbeats as NodeHeartbeatsFor sends them, each node on its own stream.
double NodeHeartbeatStreamsFor(const Coordinator& c, const NodeAgents& agents, absl::Duration window, Calls& calls,
                               bool changes_only) {
  const int nodes = static_cast<int>(agents.clients.size());
  std::vector<v1::NodeHeartbeatRequest> reqs = NodeHeartbeatRequests(agents);
  std::vector<std::unique_ptr<HeartbeatStream>> streams;
  for (int i = 0; i < nodes; ++i) {
    streams.push_back(std::make_unique<HeartbeatStream>(*agents.clients[i], calls, changes_only));
  }
  double cpu0 = CpuSeconds(c.pid());
  absl::Time start = absl::Now();
  Paced(nodes, absl::Seconds(2), window, [&](int i, int64_t round) {
    for (v1::RankHeartbeat& beat : *reqs[i].mutable_ranks()) beat.set_step(round + 1);
    streams[i]->Beat(reqs[i]);
  });
  double share = (CpuSeconds(c.pid()) - cpu0) / absl::ToDoubleSeconds(absl::Now() - start);
  for (auto& s : streams) {
    if (!s->Close()) ++calls.errors;
  }
  return share;
}

// One rank's store session (StoreService.Session) as a node's barrier needs it: opened, then one
// arrival. The node's first rank arrives as itself and is answered with the release; its last
// arrival is a relay member carrying the node's other ranks (relayed_ranks), as the node relay
// sends it, and is not answered (an answer is an error). Two sessions and two messages per node.
class BarrierSession final : public grpc::ClientBidiReactor<v1::StoreRequest, v1::StoreResponse> {
 public:
  BarrierSession(CoordinatorClient& client, const std::string& run_id, int rank, std::atomic<int>& opened,
                 std::atomic<int>& released, std::atomic<int>& errors)
      : opened_(opened), released_(released), errors_(errors), context_(client.Context(absl::InfiniteDuration())) {
    client.store().async()->Session(context_.get(), this);
    request_.set_id(1);
    request_.mutable_open()->set_run_id(run_id);
    request_.mutable_open()->set_rank(rank);
    StartWrite(&request_);
    StartCall();
  }

  // The node's first arrival (`carried` empty: answered with the release) or its last (a relay
  // member carrying `carried`).
  void Arrive(const std::string& name, const std::vector<int>& carried) {
    request_.Clear();
    request_.set_id(2);
    v1::StoreBarrierRequest& b = *request_.mutable_barrier();
    b.set_name(name);
    b.set_sequence(1);
    b.set_timeout_ms(120'000);
    if (!carried.empty()) {
      b.set_relay_member(true);
      for (int r : carried) b.add_relayed_ranks(r);
    }
    StartWrite(&request_);
  }

  void End() {
    StartWritesDone();
    done_.WaitForNotification();
  }

  // The time the release arrived (the first arrival's session).
  Clock::time_point released_at() const { return released_at_; }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      ++errors_;
      return;
    }
    StartRead(&response_);  // the open's answer, the release, or (a member) only an error
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended
    if ((response_.has_status() && response_.status().code() != 0) ||
        (response_.id() == 2 && request_.barrier().relay_member())) {
      ++errors_;
    } else if (response_.id() == 1) {
      ++opened_;
    } else {
      released_at_ = Clock::now();
      ++released_;
    }
  }
  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) ++errors_;
    done_.Notify();
  }

 private:
  std::atomic<int>& opened_;
  std::atomic<int>& released_;
  std::atomic<int>& errors_;
  std::unique_ptr<grpc::ClientContext> context_;
  v1::StoreRequest request_;
  v1::StoreResponse response_;
  Clock::time_point released_at_;
  absl::Notification done_;
};

struct BarrierTimes {
  double last_arrival_to_release = 0;  // seconds
  double first_arrival_to_release = 0;
  int errors = 0;
};

// One barrier of every rank: each node's first rank arrives on its own session, then its last
// arrives carrying the other six; from the last message written to the last release read.
BarrierTimes NodeBarrier(const NodeAgents& agents) {
  const int nodes = static_cast<int>(agents.clients.size());
  std::atomic<int> opened{0}, released{0}, errors{0};
  std::vector<std::unique_ptr<BarrierSession>> first(nodes), last(nodes);
  std::vector<std::vector<int>> carried(nodes);
  for (int i = 0; i < nodes; ++i) {
    const v1::RegisterNodeResponse& seats = agents.seats[i];
    const std::string& run = agents.requests[i].run_id();
    first[i] =
        std::make_unique<BarrierSession>(*agents.clients[i], run, seats.slots(0).rank(), opened, released, errors);
    const int ppn = seats.slots_size();
    last[i] = std::make_unique<BarrierSession>(*agents.clients[i], run, seats.slots(ppn - 1).rank(), opened, released,
                                               errors);
    for (int s = 1; s + 1 < ppn; ++s) carried[i].push_back(seats.slots(s).rank());
  }
  while (opened.load() + errors.load() < 2 * nodes) absl::SleepFor(absl::Milliseconds(5));
  BarrierTimes out;
  auto start = Clock::now();
  for (int i = 0; i < nodes; ++i) first[i]->Arrive("scale", {});
  for (int i = 0; i < nodes; ++i) last[i]->Arrive("scale", carried[i]);
  auto last_arrival = Clock::now();
  while (released.load() + errors.load() < nodes) absl::SleepFor(absl::Milliseconds(1));
  Clock::time_point end = start;
  for (auto& s : first) end = std::max(end, s->released_at());
  for (int i = 0; i < nodes; ++i) {
    first[i]->End();
    last[i]->End();
  }
  out.last_arrival_to_release = std::chrono::duration<double>(end - last_arrival).count();
  out.first_arrival_to_release = std::chrono::duration<double>(end - start).count();
  out.errors = errors.load();
  return out;
}

// Node counts for NodeAgentBench; `bench_scale 12288` runs one (for investigating a row).
std::vector<int> node_counts = {128, 1024, 4096, 12288};

// The curve at 1K, 8K, 32K and 98K ranks (nodes of 8): registration time and dtcoord CPU per
// rank, and heartbeat load; the 98,304-rank rows are the goals.
void NodeAgentBench(const std::string& dir) {
  const int ppn = 8;
  for (int nodes : node_counts) {
    const int n = nodes * ppn;
    Coordinator c = StartCoordinator(TempDir("nodes"), "off", {"--heartbeat-timeout", "10m"});
    v1::SubmitRunResponse run = Submit(c, nodes, ppn, dir);
    NodeAgents agents = RegisterNodes(c, run, nodes, ppn);
    const bool goal = nodes == 12288;
    const std::string shape = absl::StrCat(n, " ranks (", nodes, " node agents x ", ppn, ")");
    Report({absl::StrCat("node agents: registration, ", shape), agents.seconds, "s", "goal 10 s", 10.0,
            goal ? "< 1x" : "", false, goal ? 1.0 : 0});
    Report({absl::StrCat("node agents: registration time per rank, ", shape), 1e6 * agents.seconds / n, "us", "", 0, "",
            false, 0});
    Report({absl::StrCat("node agents: coordinator CPU per rank registered, ", shape), 1e6 * agents.cpu_seconds / n,
            "us", "", 0, "", false, 0});
    const absl::Duration window = Quick() ? absl::Seconds(10) : absl::Seconds(30);
    Calls unary;
    double unary_share = NodeHeartbeatsFor(c, agents, window, unary);
    Summary u = unary.Take();
    std::cout << "node heartbeat calls: " << u.n << " answered, " << unary.errors.load() << " failed, p50 " << u.p50
              << " ms, p99 " << u.p99 << " ms\n";
    Report({absl::StrCat("node agents: coordinator CPU, ", shape, ", heartbeating every 2 s (a call each)"),
            100.0 * unary_share, "% core", "", 0, "", false, 0});
    Calls streamed;
    double share = NodeHeartbeatStreamsFor(c, agents, window, streamed, false);
    Summary s = streamed.Take();
    std::cout << "node heartbeat streams: " << s.n << " answered, " << streamed.errors.load() << " failed, p50 "
              << s.p50 << " ms, p99 " << s.p99 << " ms\n";
    Report({absl::StrCat("node agents: coordinator CPU, ", shape, ", heartbeating every 2 s (node streams)"),
            100.0 * share, "% core", "", 0, "", false, 0});
    Calls quiet;
    double quiet_share = NodeHeartbeatStreamsFor(c, agents, window, quiet, true);
    Summary q = quiet.Take();
    std::cout << "node heartbeat streams, answers on change: " << q.n << " sent, " << quiet.errors.load()
              << " failed, p50 " << q.p50 << " ms, p99 " << q.p99 << " ms (first answer, then written)\n";
    Report({absl::StrCat("node agents: coordinator CPU, ", shape,
                         ", heartbeating every 2 s (node streams, answers on change)"),
            100.0 * quiet_share, "% core", "goal 50%", 50.0, goal ? "< 1x" : "", false, goal ? 1.0 : 0});
    Report({absl::StrCat(
                "node agents: coordinator CPU per 1,000 ranks heartbeating (node streams, answers on change), ", shape),
            100.0 * quiet_share * 1000 / n, "% core", "", 0, "", false, 0});
    Report({absl::StrCat("node agents: coordinator peak RSS, ", shape), MemoryMiB(c.pid(), "VmHWM"), "MiB",
            "goal 2 GiB", 2048.0, goal ? "< 1x" : "", false, goal ? 1.0 : 0});
    BarrierTimes barrier = NodeBarrier(agents);
    std::cout << "node barrier: released " << barrier.last_arrival_to_release << " s after the last arrival was sent, "
              << barrier.first_arrival_to_release << " s after the first; " << barrier.errors << " errors\n";
    Report({absl::StrCat("node agents: barrier of every rank, last arrival to release, ", shape),
            barrier.last_arrival_to_release, "s", "goal 1 s", 1.0, goal ? "< 1x" : "", false, goal ? 1.0 : 0});
    Report({absl::StrCat("node agents: barrier of every rank, first arrival to release, ", shape),
            barrier.first_arrival_to_release, "s", "", 0, "", false, 0});
    Report({absl::StrCat("node agents: barrier errors, ", shape), static_cast<double>(barrier.errors), "calls",
            "goal 0 (of 1)", 1.0, goal ? "< 1x" : "", false, goal ? 1.0 : 0});
    Report({absl::StrCat("node agents: failed heartbeats, ", shape),
            static_cast<double>(unary.errors.load() + streamed.errors.load() + quiet.errors.load()), "calls",
            "goal 0 (of 1)", 1.0, goal ? "< 1x" : "", false, goal ? 1.0 : 0});
  }
}

void LoadBench(const std::string& dir) {
  Coordinator c = StartCoordinator(TempDir("load"), "127.0.0.1:0");
  std::vector<std::string> run_ids;
  std::vector<LoadRank> ranks = RegisterLoad(c, dir, &run_ids);
  const int n = static_cast<int>(ranks.size());
  absl::Duration window = Quick() ? absl::Seconds(20) : absl::Minutes(2);
  Calls heartbeats, batches, store;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  // Store traffic: a set and a get every 100 ms in every run.
  for (size_t r = 0; r < run_ids.size(); ++r) {
    threads.emplace_back([&, r] {
      auto session = StoreSession::Open(Connect(c, true), run_ids[r], 0, -1);
      if (!session.ok()) {
        ++store.errors;
        return;
      }
      for (int64_t i = 0; !stop; ++i) {
        auto t0 = Clock::now();
        std::string key = absl::StrCat("k", i % 50);
        bool ok = (*session)->Set(key, std::string(256, 'x')).ok() && (*session)->Get(key).ok();
        store.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (!ok) ++store.errors;
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }
  // Metric batches: every rank one a second, from 8 sender threads.
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      absl::Time start = absl::Now();
      for (int64_t second = 1; !stop; ++second) {
        for (int i = t; i < n && !stop; i += 8) SendBatch(ranks[i], second, batches);
        absl::Time next = start + absl::Seconds(second);
        if (absl::Now() < next) absl::SleepFor(next - absl::Now());
      }
    });
  }
  double cpu0 = CpuSeconds(c.pid());
  absl::Time start = absl::Now();
  SendHeartbeatsFor(ranks, window, heartbeats);
  double wall = absl::ToDoubleSeconds(absl::Now() - start);
  double cpu = CpuSeconds(c.pid()) - cpu0;
  double rss = MemoryMiB(c.pid(), "VmRSS"), peak = MemoryMiB(c.pid(), "VmHWM");
  stop = true;
  for (auto& t : threads) t.join();
  std::string load = absl::StrCat(n, " ranks in ", run_ids.size(), " runs");
  int64_t errors = heartbeats.errors + batches.errors + store.errors;
  for (auto [name, calls, goal] :
       {std::tuple{"heartbeat", &heartbeats, 50.0}, std::tuple{"metric batch", &batches, 100.0},
        std::tuple{"store set+get", &store, 50.0}}) {
    Summary s = calls->Take();
    std::cout << name << ": " << s.n << " calls, " << calls->errors.load() << " errors\n";
    Report({absl::StrCat("load, ", load, ": ", name, " p50"), s.p50, "ms", absl::StrCat("goal ", goal, " ms"), goal, "",
            false, 0});
    Report({absl::StrCat("load, ", load, ": ", name, " p99"), s.p99, "ms", absl::StrCat("goal ", goal, " ms"), goal,
            "< 1x", false, 1.0});
  }
  Report({absl::StrCat("load, ", load, ": dtcoord CPU"), 100.0 * cpu / wall, "% core", "goal 100%", 100.0, "< 1x",
          false, 1.0});
  Report({absl::StrCat("load, ", load, ": dtcoord memory (RSS at the end, peak ", static_cast<int>(peak), " MiB)"), rss,
          "MiB", "goal 1 GiB", 1024.0, "< 1x", false, 1.0});
  Report({absl::StrCat("load, ", load, ": failed calls"), static_cast<double>(errors), "calls", "goal 0 (of 1)", 1.0,
          "< 1x", false, 1.0});
}

// A storm of submissions past --max-ranks: 8 clients submit 8-rank runs back to back while the
// admitted run's 512 ranks heartbeat every 2 s. Every submission must be refused with
// RESOURCE_EXHAUSTED; the admitted ranks' heartbeat p99 is the goal row.
void StormBench(const std::string& dir) {
  const int nodes = 64, ppn = 8, n = nodes * ppn;
  Coordinator c = StartCoordinator(TempDir("storm"), "off", {"--max-ranks", std::to_string(n)});
  v1::SubmitRunResponse run = Submit(c, nodes, ppn, dir);
  std::vector<LoadRank> ranks;
  AddLoadRanks(run, RegisterAll(c, run, nodes, ppn), ranks);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> refused{0}, wrong{0};
  std::vector<std::thread> storm;
  for (int t = 0; t < 8; ++t) {
    storm.emplace_back([&] {
      auto admin = Connect(c, true);
      while (!stop) {
        auto answer =
            Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), SubmitRequest(1, 8, dir), absl::Seconds(30));
        bool named = answer.status().code() == absl::StatusCode::kResourceExhausted &&
                     absl::StrContains(answer.status().message(), "--max-ranks");
        ++(named ? refused : wrong);
      }
    });
  }
  Calls heartbeats;
  double cpu0 = CpuSeconds(c.pid());
  absl::Time start = absl::Now();
  SendHeartbeatsFor(ranks, Quick() ? absl::Seconds(10) : absl::Seconds(30), heartbeats);
  double wall = absl::ToDoubleSeconds(absl::Now() - start);
  double cpu = CpuSeconds(c.pid()) - cpu0;
  stop = true;
  for (auto& t : storm) t.join();
  Summary s = heartbeats.Take();
  std::cout << "storm: " << refused.load() << " submissions refused (" << refused.load() / wall << "/s), "
            << wrong.load() << " answered otherwise; " << s.n << " heartbeats, " << heartbeats.errors.load()
            << " failed; dtcoord CPU " << 100.0 * cpu / wall << "% of a core\n";
  std::string load = absl::StrCat(n, " ranks heartbeating, 8 clients submitting past --max-ranks");
  Report({absl::StrCat("storm, ", load, ": heartbeat p99"), s.p99, "ms", "goal 50 ms", 50.0, "< 1x", false, 1.0});
  Report({absl::StrCat("storm, ", load, ": calls answered wrongly (heartbeats failed, submissions not refused)"),
          static_cast<double>(heartbeats.errors.load() + wrong.load()), "calls", "goal 0 (of 1)", 1.0, "< 1x", false,
          1.0});
}

}  // namespace
}  // namespace dt::bench

// Arguments name the parts to run (rendezvous, heartbeat, load, storm, nodes); none: all of them.
// Numbers among them are the node counts of `nodes` (8 ranks each); numbers alone run `nodes`.
int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  std::string dir = dt::bench::TempDir("scale-runs");
  std::cout << "== coordinator scale: rendezvous and heartbeat load (dtcoord process, loopback)\n";
  std::vector<std::pair<std::string, void (*)(const std::string&)>> parts = {{"rendezvous", dt::bench::RendezvousBench},
                                                                             {"heartbeat", dt::bench::HeartbeatBench},
                                                                             {"load", dt::bench::LoadBench},
                                                                             {"storm", dt::bench::StormBench},
                                                                             {"nodes", dt::bench::NodeAgentBench}};
  std::vector<std::string> asked;
  std::vector<int> counts;
  for (int i = 1; i < argc; ++i) {
    int count = 0;
    if (absl::SimpleAtoi(argv[i], &count)) {
      if (count <= 0) {
        std::cerr << "bench_scale: a node count must be positive, not " << argv[i] << "\n";
        return 2;
      }
      counts.push_back(count);
    } else {
      asked.push_back(argv[i]);
    }
  }
  if (!counts.empty()) {
    dt::bench::node_counts = counts;
    if (asked.empty()) asked.push_back("nodes");  // counts alone: the node agents' part
  }
  for (const auto& [name, part] : parts) {
    if (asked.empty() || std::find(asked.begin(), asked.end(), name) != asked.end()) part(dir);
  }
  return 0;
}
