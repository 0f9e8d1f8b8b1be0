// Every status code that proto/dt/v1/*.proto lists for an RPC, provoked over real gRPC against a
// real coordinator, one case each; and a check that this table and the protos name the same
// (RPC, code) pairs, so neither the documentation nor the behaviour can drift from the other.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "client/agent.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/limits.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using Code = grpc::StatusCode;

constexpr char kUnknownRun[] = "r-00000000000000ff";
constexpr char kMalformedRun[] = "not a run id";

// A coordinator with two runs (one node × two ranks each) and clients with every kind of token.
constexpr int64_t kStoreBytes = 64 << 10;  // each run's store budget here
constexpr int kBarrierNames = 4;           // distinct barrier names a generation may use here

struct Env {
  // Ranks registered here send no heartbeats: the heartbeat timeout is long. A case about the
  // rendezvous timeout shortens that.
  explicit Env(absl::Duration rendezvous_timeout) {
    EmbeddedOptions o;
    o.timeouts.heartbeat_interval = absl::Seconds(1);
    o.timeouts.heartbeat_timeout = absl::Seconds(60);
    o.timeouts.hang_timeout = absl::Minutes(5);
    o.timeouts.rendezvous_timeout = rendezvous_timeout;
    o.health_check_period = absl::Milliseconds(25);
    o.store_bytes_per_run = kStoreBytes;
    o.max_barrier_names = kBarrierNames;
    coord = std::make_unique<EmbeddedCoordinator>(tmp.Sub("state"), o);
    admin = coord->AdminClient();
    no_token = coord->Client("");
    run = Submit("run", 1);
    other = Submit("other", 0);
    run_client = coord->Client(run.run_token());
    other_client = coord->Client(other.run_token());
  }

  v1::SubmitRunResponse Submit(const std::string& name, int max_restarts) {
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec(name, tmp.Sub("runs"), 1, 2, max_restarts);
    absl::StatusOr<v1::SubmitRunResponse> r =
        Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::SubmitRunResponse();
  }

  std::unique_ptr<Agent> MakeAgent(int slot) {
    AgentOptions o;
    o.run_id = run.run_id();
    o.node = "n1";
    o.local_slot = slot;
    o.host = "host";
    o.pid = 100 + slot;
    auto agent = std::make_unique<Agent>(run_client, o);
    // Registered as capturing stacks; the tests answer captures themselves (no heartbeats here).
    agent->SetStackCapturer([] { return v1::RankStacks(); });
    return agent;
  }

  // Both ranks of `run`, registered; ranks[r] holds rank r.
  void Register() {
    ranks.clear();
    ranks.push_back(MakeAgent(0));
    ranks.push_back(MakeAgent(1));
    std::thread second([&] { EXPECT_TRUE(ranks[1]->Register(absl::Seconds(10)).ok()); });
    EXPECT_TRUE(ranks[0]->Register(absl::Seconds(10)).ok());
    second.join();
    if (ranks[0]->rank() != 0) std::swap(ranks[0], ranks[1]);
  }

  // Generation 0 fails (rank 1 reports an error); the run restarts as generation 1.
  void FailGeneration() { ASSERT_TRUE(ranks[1]->ReportError("boom", "E", "", 0).ok()); }

  void Cancel() {
    v1::CancelRunRequest req;
    req.set_run_id(run.run_id());
    ASSERT_TRUE(Call(*admin, &v1::RunService::Stub::CancelRun, admin->runs(), req, absl::Seconds(5)).ok());
  }

  // `call` on another thread; `then` runs once the coordinator holds one more waiting call than
  // before; `call`'s code.
  Code WhileWaiting(const std::function<Code()>& call, const std::function<void()>& then) {
    int64_t before = coord->waiting_calls();
    std::atomic<int> code{-1};
    std::thread waiter([&] { code = call(); });
    bool parked =
        testing::WaitFor([&] { return coord->waiting_calls() > before || code.load() != -1; }, absl::Seconds(10));
    EXPECT_TRUE(parked);
    if (code.load() == -1) then();
    waiter.join();
    return static_cast<Code>(code.load());
  }

  // Until the coordinator holds `n` waiting calls.
  void AwaitWaiting(int64_t n) {
    EXPECT_TRUE(testing::WaitFor([&] { return coord->waiting_calls() >= n; }, absl::Seconds(10)));
  }

  void Shutdown() { coord.reset(); }

  // Calls still waiting end UNAVAILABLE when the coordinator stops; then their threads are joined.
  ~Env() {
    Shutdown();
    for (std::thread& t : background) t.join();
  }

  testing::TempDir tmp;
  std::unique_ptr<EmbeddedCoordinator> coord;
  std::shared_ptr<CoordinatorClient> admin, no_token, run_client, other_client;
  v1::SubmitRunResponse run, other;
  std::vector<std::unique_ptr<Agent>> ranks;
  std::vector<std::thread> background;  // calls a case leaves waiting
};

// A unary call's raw gRPC code (the client library turns some codes into others).
template <typename Stub, typename Request, typename Response>
Code Raw(CoordinatorClient& client, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
         Stub& stub, const Request& request, absl::Duration timeout = absl::Seconds(10),
         grpc::ClientContext** context_out = nullptr) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(timeout);
  if (context_out != nullptr) *context_out = ctx.get();
  Response response;
  return (stub.*method)(ctx.get(), request, &response).error_code();
}

// ---- Requests -----------------------------------------------------------------------------

v1::RegisterRequest RegisterReq(const std::string& run, int slot, const std::string& incarnation) {
  v1::RegisterRequest r;
  r.set_run_id(run);
  r.set_node("n1");
  r.set_local_slot(slot);
  r.set_incarnation(incarnation);
  r.set_host("host");
  r.set_pid(7);
  return r;
}

// A RegisterNode of node n1's `slots`, each with incarnation "i<slot>".
v1::RegisterNodeRequest NodeReq(const std::string& run, const std::vector<int>& slots) {
  v1::RegisterNodeRequest r;
  r.set_run_id(run);
  r.set_node("n1");
  r.set_host("host");
  for (int slot : slots) {
    v1::NodeSlot& s = *r.add_slots();
    s.set_local_slot(slot);
    s.set_incarnation(absl::StrCat("i", slot));
    s.set_pid(7 + slot);
  }
  return r;
}

template <typename Request>
Request RankReq(const Env& e, int rank) {
  Request r;
  r.set_run_id(e.run.run_id());
  r.set_generation(e.ranks.empty() ? 0 : e.ranks[rank]->generation());
  r.set_rank(rank);
  return r;
}

v1::HeartbeatRequest BeatReq(const Env& e, int rank) {
  v1::HeartbeatRequest r = RankReq<v1::HeartbeatRequest>(e, rank);
  r.set_incarnation(e.ranks[rank]->incarnation());
  return r;
}

v1::ReportErrorRequest ErrorReq(const Env& e, int rank) {
  v1::ReportErrorRequest r = RankReq<v1::ReportErrorRequest>(e, rank);
  r.set_incarnation(e.ranks[rank]->incarnation());
  r.set_message("a test failure");
  return r;
}

v1::ReportStoppedRequest StoppedReq(const Env& e, int rank, const std::string& incarnation) {
  v1::ReportStoppedRequest r = RankReq<v1::ReportStoppedRequest>(e, rank);
  r.set_incarnation(incarnation);
  r.set_signal(15);
  return r;
}

v1::ReportPreflightRequest PreflightReq(const Env& e, int rank, const std::string& incarnation) {
  v1::ReportPreflightRequest r = RankReq<v1::ReportPreflightRequest>(e, rank);
  r.set_incarnation(incarnation);
  r.mutable_result()->set_device("cpu");
  r.mutable_result()->set_matmul_size(512);
  r.mutable_result()->set_matmul_seconds(0.01);
  return r;
}

v1::LeaveRequest LeaveReq(const Env& e, int rank, const std::string& incarnation) {
  v1::LeaveRequest r = RankReq<v1::LeaveRequest>(e, rank);
  r.set_incarnation(incarnation);
  r.set_final_step(0);
  return r;
}

v1::BarrierRequest BarrierReq(const Env& e, int rank, int64_t timeout_ms = 10'000) {
  v1::BarrierRequest r = RankReq<v1::BarrierRequest>(e, rank);
  r.set_name("b");
  r.set_timeout_ms(timeout_ms);
  return r;
}

v1::BeginCheckpointRequest BeginReq(const Env& e, int rank, int64_t step = 5, int64_t timeout_ms = 10'000) {
  v1::BeginCheckpointRequest r = RankReq<v1::BeginCheckpointRequest>(e, rank);
  r.set_step(step);
  r.set_timeout_ms(timeout_ms);
  return r;
}

v1::StoreScope Scope(const std::string& run, int64_t generation = 0) {
  v1::StoreScope s;
  s.set_run_id(run);
  s.set_generation(generation);
  s.set_rank(-1);
  return s;
}

// Both ranks open a round at step 5; the writer's reply.
v1::BeginCheckpointResponse OpenRound(Env& e) {
  v1::BeginCheckpointResponse writer;
  std::thread other([&] { EXPECT_TRUE(e.ranks[1]->BeginCheckpoint(5).ok()); });
  absl::StatusOr<v1::BeginCheckpointResponse> r = e.ranks[0]->BeginCheckpoint(5);
  other.join();
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : writer;
}

// The writer's manifest of one file it wrote into the round's directory; `corrupt`: the manifest's
// size does not match the file (what the coordinator checks by default).
v1::Manifest WriteOneFile(const v1::BeginCheckpointResponse& round, bool corrupt = false) {
  const std::string content = "weights";
  EXPECT_TRUE(WriteFileAtomic(JoinPath(round.partial_dir(), "model.pt"), content).ok());
  v1::Manifest m;
  v1::ManifestFile* f = m.add_files();
  f->set_name("model.pt");
  f->set_size(static_cast<int64_t>(content.size()));
  if (corrupt) f->set_size(f->size() + 1);
  f->set_sha256(Sha256Hex(content));
  return m;
}

v1::CommitCheckpointRequest CommitReq(const Env& e, int rank, const std::string& round_id) {
  v1::CommitCheckpointRequest r = RankReq<v1::CommitCheckpointRequest>(e, rank);
  r.set_round_id(round_id);
  return r;
}

v1::AbortCheckpointRequest AbortReq(const Env& e, int rank, const std::string& round_id) {
  v1::AbortCheckpointRequest r = RankReq<v1::AbortCheckpointRequest>(e, rank);
  r.set_round_id(round_id);
  r.set_reason("giving up");
  return r;
}

Code ReportMetrics(CoordinatorClient& client, const std::vector<v1::MetricBatch>& batches) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(absl::Seconds(10));
  v1::ReportMetricsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::MetricBatch>> writer = client.metrics().ReportMetrics(ctx.get(), &response);
  for (const auto& b : batches) {
    if (!writer->Write(b)) break;
  }
  writer->WritesDone();
  return writer->Finish().error_code();
}

v1::MetricBatch Batch(const std::string& run, int64_t generation, int rank, size_t name_bytes = 4) {
  v1::MetricBatch b;
  b.set_run_id(run);
  b.set_generation(generation);
  b.set_rank(rank);
  v1::MetricPoint* p = b.add_points();
  p->set_step(1);
  p->set_time(1.8e9);
  (*p->mutable_values())[std::string(name_bytes, 'l')] = 1.0;
  return b;
}

// A store session that opens `scope`, then (if given) sends `then`; the stream's final code.
Code Session(CoordinatorClient& client, const v1::StoreScope& scope, bool open_first = true,
             const std::function<void()>& while_open = nullptr) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(absl::Seconds(10));
  auto stream = client.store().Session(ctx.get());
  v1::StoreRequest req;
  req.set_id(1);
  if (open_first) {
    *req.mutable_open() = scope;
  } else {
    req.mutable_num_keys();
  }
  stream->Write(req);
  v1::StoreResponse response;
  if (stream->Read(&response) && while_open) while_open();
  stream->WritesDone();
  while (stream->Read(&response)) {
  }
  return stream->Finish().error_code();
}

Code Watch(CoordinatorClient& client, const std::string& run, const std::function<void()>& after_first = nullptr) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(absl::Seconds(10));
  v1::WatchRunRequest req;
  req.set_run_id(run);
  auto reader = client.runs().WatchRun(ctx.get(), req);
  v1::RunEvent event;
  bool first = true;
  while (reader->Read(&event)) {
    if (first && after_first) after_first();
    first = false;
  }
  return reader->Finish().error_code();
}

// ---- The table ----------------------------------------------------------------------------

struct Case {
  std::string rpc;  // "Service.Method"
  Code code;
  std::function<Code(Env&)> provoke;
  absl::Duration rendezvous_timeout = absl::Seconds(30);
};

std::string CodeName(Code c) {
  static const std::map<Code, std::string> names = {
      {Code::OK, "OK"},
      {Code::CANCELLED, "CANCELLED"},
      {Code::INVALID_ARGUMENT, "INVALID_ARGUMENT"},
      {Code::DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"},
      {Code::NOT_FOUND, "NOT_FOUND"},
      {Code::ALREADY_EXISTS, "ALREADY_EXISTS"},
      {Code::PERMISSION_DENIED, "PERMISSION_DENIED"},
      {Code::RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED"},
      {Code::FAILED_PRECONDITION, "FAILED_PRECONDITION"},
      {Code::ABORTED, "ABORTED"},
      {Code::INTERNAL, "INTERNAL"},
      {Code::UNAVAILABLE, "UNAVAILABLE"},
      {Code::DATA_LOSS, "DATA_LOSS"},
      {Code::UNAUTHENTICATED, "UNAUTHENTICATED"},
  };
  auto it = names.find(c);
  return it == names.end() ? absl::StrCat("code ", static_cast<int>(c)) : it->second;
}

// The three codes of any run-scoped RPC whose request names a run: a missing token, another
// run's token, and a run that does not exist. `call(client, run_id)`.
void RunScoped(std::vector<Case>& t, const std::string& rpc,
               const std::function<Code(Env&, CoordinatorClient&, const std::string&)>& call) {
  t.push_back({rpc, Code::UNAUTHENTICATED, [call](Env& e) { return call(e, *e.no_token, e.run.run_id()); }});
  t.push_back({rpc, Code::PERMISSION_DENIED, [call](Env& e) { return call(e, *e.other_client, e.run.run_id()); }});
  t.push_back({rpc, Code::NOT_FOUND, [call](Env& e) { return call(e, *e.admin, kUnknownRun); }});
}

void RunRpcs(std::vector<Case>& t) {
  t.push_back({"RunService.SubmitRun", Code::OK, [](Env& e) {
                 v1::SubmitRunRequest r;
                 *r.mutable_spec() = testing::MakeSpec("fresh", e.tmp.Sub("runs"), 1, 1, 0);
                 return Raw(*e.admin, &v1::RunService::Stub::SubmitRun, e.admin->runs(), r);
               }});
  auto submit = [](Env& e, CoordinatorClient& c, v1::RunSpec spec) {
    v1::SubmitRunRequest r;
    *r.mutable_spec() = spec;
    return Raw(c, &v1::RunService::Stub::SubmitRun, c.runs(), r);
  };
  t.push_back({"RunService.SubmitRun", Code::INVALID_ARGUMENT,
               [submit](Env& e) { return submit(e, *e.admin, testing::MakeSpec("", e.tmp.Sub("runs"), 1, 1, 0)); }});
  t.push_back({"RunService.SubmitRun", Code::ALREADY_EXISTS,
               [submit](Env& e) { return submit(e, *e.admin, testing::MakeSpec("run", e.tmp.Sub("runs"), 1, 1, 0)); }});
  t.push_back({"RunService.SubmitRun", Code::FAILED_PRECONDITION, [submit](Env& e) {
                 std::string file = JoinPath(e.tmp.path(), "a-file");
                 EXPECT_TRUE(WriteFileAtomic(file, "x").ok());
                 return submit(e, *e.admin, testing::MakeSpec("x", JoinPath(file, "below"), 1, 1, 0));
               }});
  t.push_back({"RunService.SubmitRun", Code::RESOURCE_EXHAUSTED, [submit](Env& e) {
                 return submit(e, *e.admin, testing::MakeSpec("huge", e.tmp.Sub("runs"), 1024, 1024, 0));
               }});
  t.push_back({"RunService.SubmitRun", Code::UNAUTHENTICATED, [submit](Env& e) {
                 return submit(e, *e.no_token, testing::MakeSpec("x", e.tmp.Sub("runs"), 1, 1, 0));
               }});
  t.push_back({"RunService.SubmitRun", Code::PERMISSION_DENIED, [submit](Env& e) {
                 return submit(e, *e.run_client, testing::MakeSpec("x", e.tmp.Sub("runs"), 1, 1, 0));
               }});

  auto get = [](Env&, CoordinatorClient& c, const std::string& run) {
    v1::GetRunRequest r;
    r.set_run_id(run);
    return Raw(c, &v1::RunService::Stub::GetRun, c.runs(), r);
  };
  t.push_back({"RunService.GetRun", Code::OK, [get](Env& e) { return get(e, *e.run_client, e.run.run_id()); }});
  t.push_back({"RunService.GetRun", Code::INVALID_ARGUMENT, [get](Env& e) { return get(e, *e.admin, kMalformedRun); }});
  RunScoped(t, "RunService.GetRun", get);

  auto list = [](Env&, CoordinatorClient& c, int limit) {
    v1::ListRunsRequest r;
    r.set_limit(limit);
    return Raw(c, &v1::RunService::Stub::ListRuns, c.runs(), r);
  };
  t.push_back({"RunService.ListRuns", Code::OK, [list](Env& e) { return list(e, *e.admin, 10); }});
  t.push_back({"RunService.ListRuns", Code::INVALID_ARGUMENT, [list](Env& e) { return list(e, *e.admin, -1); }});
  t.push_back({"RunService.ListRuns", Code::UNAUTHENTICATED, [list](Env& e) { return list(e, *e.no_token, 10); }});
  t.push_back({"RunService.ListRuns", Code::PERMISSION_DENIED, [list](Env& e) { return list(e, *e.run_client, 10); }});

  auto cancel = [](Env&, CoordinatorClient& c, const std::string& run) {
    v1::CancelRunRequest r;
    r.set_run_id(run);
    return Raw(c, &v1::RunService::Stub::CancelRun, c.runs(), r);
  };
  t.push_back({"RunService.CancelRun", Code::OK, [cancel](Env& e) { return cancel(e, *e.admin, e.run.run_id()); }});
  t.push_back({"RunService.CancelRun", Code::INVALID_ARGUMENT,
               [cancel](Env& e) { return cancel(e, *e.admin, kMalformedRun); }});
  t.push_back({"RunService.CancelRun", Code::NOT_FOUND, [cancel](Env& e) { return cancel(e, *e.admin, kUnknownRun); }});
  t.push_back({"RunService.CancelRun", Code::UNAUTHENTICATED,
               [cancel](Env& e) { return cancel(e, *e.no_token, e.run.run_id()); }});
  t.push_back({"RunService.CancelRun", Code::PERMISSION_DENIED,
               [cancel](Env& e) { return cancel(e, *e.run_client, e.run.run_id()); }});

  auto attach = [](Env&, CoordinatorClient& c, const std::string& run, const std::string& job) {
    v1::AttachLaunchRequest r;
    r.set_run_id(run);
    r.set_scheduler_job_id(job);
    r.set_launcher_host("login");
    return Raw(c, &v1::RunService::Stub::AttachLaunch, c.runs(), r);
  };
  t.push_back({"RunService.AttachLaunch", Code::OK,
               [attach](Env& e) { return attach(e, *e.run_client, e.run.run_id(), "local:42"); }});
  t.push_back({"RunService.AttachLaunch", Code::INVALID_ARGUMENT,
               [attach](Env& e) { return attach(e, *e.run_client, e.run.run_id(), "--user=root"); }});
  t.push_back({"RunService.AttachLaunch", Code::FAILED_PRECONDITION, [attach](Env& e) {
                 e.Cancel();
                 return attach(e, *e.run_client, e.run.run_id(), "local:42");
               }});
  RunScoped(t, "RunService.AttachLaunch",
            [attach](Env& e, CoordinatorClient& c, const std::string& run) { return attach(e, c, run, "local:42"); });

  auto exclude = [](Env&, CoordinatorClient& c, const std::string& run, const std::string& node) {
    v1::ExcludeNodesRequest r;
    r.set_run_id(run);
    r.add_nodes()->set_node(node);
    return Raw(c, &v1::RunService::Stub::ExcludeNodes, c.runs(), r);
  };
  t.push_back({"RunService.ExcludeNodes", Code::OK,
               [exclude](Env& e) { return exclude(e, *e.run_client, e.run.run_id(), "n9"); }});
  t.push_back({"RunService.ExcludeNodes", Code::INVALID_ARGUMENT,
               [exclude](Env& e) { return exclude(e, *e.run_client, e.run.run_id(), "--user=root"); }});
  t.push_back({"RunService.ExcludeNodes", Code::FAILED_PRECONDITION, [exclude](Env& e) {
                 e.Cancel();
                 return exclude(e, *e.run_client, e.run.run_id(), "n9");
               }});
  RunScoped(t, "RunService.ExcludeNodes",
            [exclude](Env& e, CoordinatorClient& c, const std::string& run) { return exclude(e, c, run, "n9"); });

  t.push_back({"RunService.WatchRun", Code::OK,
               [](Env& e) { return Watch(*e.run_client, e.run.run_id(), [&e] { e.Cancel(); }); }});
  t.push_back({"RunService.WatchRun", Code::INVALID_ARGUMENT, [](Env& e) { return Watch(*e.admin, kMalformedRun); }});
  t.push_back({"RunService.WatchRun", Code::UNAVAILABLE,
               [](Env& e) { return Watch(*e.run_client, e.run.run_id(), [&e] { e.Shutdown(); }); }});
  RunScoped(t, "RunService.WatchRun", [](Env&, CoordinatorClient& c, const std::string& run) { return Watch(c, run); });
}

// Runs that fill dtcoord's default --max-ranks but one rank, and a counted run (--nproc-per-node
// gpu) whose node has not registered yet: a node counting two passes the limit. Its run id.
std::optional<std::string> CountedRunOneRankShortOfTheLimit(Env& e) {
  for (int fill_run = 0;; ++fill_run) {
    int64_t left = kDefaultMaxRanks - e.coord->coordinator().TakeCensus().admitted_ranks;
    if (left <= 1) break;
    v1::SubmitRunRequest fill;
    *fill.mutable_spec() = testing::MakeSpec(absl::StrCat("fill-", fill_run), e.tmp.Sub("runs"), 1,
                                             static_cast<int>(std::min(left - 1, kMaxWorldSize)), 0);
    if (Raw(*e.admin, &v1::RunService::Stub::SubmitRun, e.admin->runs(), fill) != Code::OK) return std::nullopt;
  }
  v1::SubmitRunRequest counted;
  *counted.mutable_spec() = testing::MakeSpec("counted", e.tmp.Sub("runs"), 1, 0, 0);
  counted.mutable_spec()->set_procs_per_node_rule("gpu");
  counted.mutable_spec()->add_exec_command("/bin/true");
  auto made = Call(*e.admin, &v1::RunService::Stub::SubmitRun, e.admin->runs(), counted, absl::Seconds(10));
  if (!made.ok()) return std::nullopt;
  return made->run_id();
}

void NodeRpcs(std::vector<Case>& t) {
  auto reg = [](CoordinatorClient& c, const v1::RegisterNodeRequest& r, absl::Duration timeout) {
    return Raw(c, &v1::RendezvousService::Stub::RegisterNode, c.rendezvous(), r, timeout);
  };
  const std::string rpc = "RendezvousService.RegisterNode";
  t.push_back({rpc, Code::OK, [reg](Env& e) {
                 return reg(*e.run_client, NodeReq(e.run.run_id(), {1, 0}), absl::Seconds(10));
               }});
  t.push_back({rpc, Code::INVALID_ARGUMENT, [reg](Env& e) {
                 return reg(*e.run_client, NodeReq(e.run.run_id(), {0, 0}), absl::Seconds(5));
               }});
  t.push_back({rpc, Code::FAILED_PRECONDITION, [reg](Env& e) {
                 return reg(*e.run_client, NodeReq(e.run.run_id(), {0, 1, 2}), absl::Seconds(5));
               }});
  t.push_back({rpc, Code::RESOURCE_EXHAUSTED, [reg](Env& e) {
                 std::optional<std::string> counted = CountedRunOneRankShortOfTheLimit(e);
                 if (!counted) return Code::UNKNOWN;
                 v1::RegisterNodeRequest r = NodeReq(*counted, {0, 1});
                 r.mutable_expected()->set_procs_per_node(2);
                 return reg(*e.admin, r, absl::Seconds(5));
               }});
  t.push_back({rpc, Code::DEADLINE_EXCEEDED,
               [reg](Env& e) { return reg(*e.run_client, NodeReq(e.run.run_id(), {0}), absl::Seconds(10)); },
               absl::Seconds(1)});
  t.push_back({rpc, Code::ABORTED, [reg](Env& e) {
                 return e.WhileWaiting(
                     [&] { return reg(*e.run_client, NodeReq(e.run.run_id(), {0}), absl::Seconds(10)); },
                     [&] { e.Cancel(); });
               }});
  t.push_back({rpc, Code::CANCELLED, [reg](Env& e) {
                 // A retry of the same incarnations replaces the waiting call.
                 return e.WhileWaiting(
                     [&] { return reg(*e.run_client, NodeReq(e.run.run_id(), {0}), absl::Seconds(10)); },
                     [&] {
                       e.background.emplace_back(
                           [&] { (void)reg(*e.run_client, NodeReq(e.run.run_id(), {0}), absl::Seconds(5)); });
                     });
               }});
  t.push_back({rpc, Code::UNAVAILABLE, [reg](Env& e) {
                 return e.WhileWaiting(
                     [&] { return reg(*e.run_client, NodeReq(e.run.run_id(), {0}), absl::Seconds(10)); },
                     [&] { e.Shutdown(); });
               }});
  RunScoped(t, rpc, [reg](Env&, CoordinatorClient& c, const std::string& run) {
    return reg(c, NodeReq(run, {0}), absl::Seconds(5));
  });

  auto beat = [](CoordinatorClient& c, const v1::NodeHeartbeatRequest& r) {
    return Raw(c, &v1::RendezvousService::Stub::NodeHeartbeat, c.rendezvous(), r);
  };
  // Both ranks of Env::Register's node.
  auto both = [](Env& e, const std::string& run) {
    v1::NodeHeartbeatRequest r;
    r.set_run_id(run);
    for (int rank = 0; rank < 2; ++rank) {
      v1::RankHeartbeat& b = *r.add_ranks();
      b.set_rank(rank);
      if (!e.ranks.empty()) b.set_incarnation(e.ranks[rank]->incarnation());
    }
    return r;
  };
  const std::string hb = "RendezvousService.NodeHeartbeat";
  t.push_back({hb, Code::OK, [beat, both](Env& e) {
                 e.Register();
                 return beat(*e.run_client, both(e, e.run.run_id()));
               }});
  t.push_back({hb, Code::INVALID_ARGUMENT, [beat, both](Env& e) {
                 e.Register();
                 v1::NodeHeartbeatRequest r = both(e, e.run.run_id());
                 r.mutable_ranks(1)->set_step(-1);
                 return beat(*e.run_client, r);
               }});
  RunScoped(t, hb,
            [beat, both](Env& e, CoordinatorClient& c, const std::string& run) { return beat(c, both(e, run)); });

  // The stream: each message written and its answer read, then closed; the stream's status
  // (UNKNOWN when an answer did not tell each rank to go on).
  auto stream = [](CoordinatorClient& c, const std::vector<v1::NodeHeartbeatRequest>& messages) {
    std::unique_ptr<grpc::ClientContext> ctx = c.Context(absl::Seconds(10));
    auto s = c.rendezvous().NodeHeartbeats(ctx.get());
    bool answered_right = true;
    for (const v1::NodeHeartbeatRequest& m : messages) {
      v1::NodeHeartbeatResponse answer;
      if (!s->Write(m) || !s->Read(&answer)) break;
      answered_right = answered_right && answer.ranks_size() == m.ranks_size();
      for (const auto& rank : answer.ranks()) {
        answered_right = answered_right && rank.reply().directive() == v1::HeartbeatResponse::CONTINUE;
      }
    }
    s->WritesDone();
    Code code = s->Finish().error_code();
    return code == Code::OK && !answered_right ? Code::UNKNOWN : code;
  };
  const std::string hbs = "RendezvousService.NodeHeartbeats";
  t.push_back({hbs, Code::OK, [stream, both](Env& e) {
                 e.Register();
                 return stream(*e.run_client, {both(e, e.run.run_id()), both(e, e.run.run_id())});
               }});
  t.push_back({hbs, Code::INVALID_ARGUMENT, [stream, both](Env& e) {
                 e.Register();
                 return stream(*e.admin, {both(e, e.run.run_id()), both(e, e.other.run_id())});
               }});
  RunScoped(t, hbs,
            [stream, both](Env& e, CoordinatorClient& c, const std::string& run) { return stream(c, {both(e, run)}); });
}

void RendezvousRpcs(std::vector<Case>& t) {
  auto reg = [](Env&, CoordinatorClient& c, const v1::RegisterRequest& r, absl::Duration timeout) {
    return Raw(c, &v1::RendezvousService::Stub::Register, c.rendezvous(), r, timeout);
  };
  t.push_back({"RendezvousService.Register", Code::OK, [](Env& e) {
                 e.Register();
                 return e.ranks[0]->generation() == 0 ? Code::OK : Code::UNKNOWN;
               }});
  t.push_back({"RendezvousService.Register", Code::INVALID_ARGUMENT, [reg](Env& e) {
                 return reg(e, *e.run_client, RegisterReq(e.run.run_id(), -3, "i"), absl::Seconds(5));
               }});
  t.push_back({"RendezvousService.Register", Code::FAILED_PRECONDITION, [reg](Env& e) {
                 v1::RegisterRequest r = RegisterReq(e.run.run_id(), 0, "i");
                 r.mutable_expected()->set_world_size(8);
                 r.mutable_expected()->set_nodes(2);
                 r.mutable_expected()->set_procs_per_node(4);
                 return reg(e, *e.run_client, r, absl::Seconds(5));
               }});
  t.push_back({"RendezvousService.Register", Code::RESOURCE_EXHAUSTED, [reg](Env& e) {
                 std::optional<std::string> counted = CountedRunOneRankShortOfTheLimit(e);
                 if (!counted) return Code::UNKNOWN;
                 v1::RegisterRequest r = RegisterReq(*counted, 0, "i");
                 r.mutable_expected()->set_procs_per_node(2);
                 return reg(e, *e.admin, r, absl::Seconds(5));
               }});
  t.push_back({"RendezvousService.Register", Code::DEADLINE_EXCEEDED,
               [reg](Env& e) {
                 // One of two ranks; the rendezvous timeout (1 s here) passes.
                 return reg(e, *e.run_client, RegisterReq(e.run.run_id(), 0, "i"), absl::Seconds(10));
               },
               absl::Seconds(1)});
  t.push_back({"RendezvousService.Register", Code::ABORTED, [reg](Env& e) {
                 return e.WhileWaiting(
                     [&] { return reg(e, *e.run_client, RegisterReq(e.run.run_id(), 0, "i"), absl::Seconds(10)); },
                     [&] { e.Cancel(); });
               }});
  t.push_back({"RendezvousService.Register", Code::CANCELLED, [reg](Env& e) {
                 // A retry of the same incarnation replaces the waiting call.
                 return e.WhileWaiting(
                     [&] { return reg(e, *e.run_client, RegisterReq(e.run.run_id(), 0, "i"), absl::Seconds(10)); },
                     [&] {
                       e.background.emplace_back(
                           [&] { (void)reg(e, *e.run_client, RegisterReq(e.run.run_id(), 0, "i"), absl::Seconds(5)); });
                     });
               }});
  t.push_back({"RendezvousService.Register", Code::UNAVAILABLE, [reg](Env& e) {
                 return e.WhileWaiting(
                     [&] { return reg(e, *e.run_client, RegisterReq(e.run.run_id(), 0, "i"), absl::Seconds(10)); },
                     [&] { e.Shutdown(); });
               }});
  RunScoped(t, "RendezvousService.Register", [reg](Env& e, CoordinatorClient& c, const std::string& run) {
    return reg(e, c, RegisterReq(run, 0, "i"), absl::Seconds(5));
  });

  auto beat = [](Env&, CoordinatorClient& c, const v1::HeartbeatRequest& r) {
    return Raw(c, &v1::RendezvousService::Stub::Heartbeat, c.rendezvous(), r);
  };
  auto registered = [](const std::function<Code(Env&)>& f) {
    return [f](Env& e) {
      e.Register();
      return f(e);
    };
  };
  t.push_back({"RendezvousService.Heartbeat", Code::OK,
               registered([beat](Env& e) { return beat(e, *e.run_client, BeatReq(e, 0)); })});
  t.push_back({"RendezvousService.Heartbeat", Code::INVALID_ARGUMENT, registered([beat](Env& e) {
                 v1::HeartbeatRequest r = BeatReq(e, 0);
                 r.set_rank(9);
                 return beat(e, *e.run_client, r);
               })});
  t.push_back({"RendezvousService.Heartbeat", Code::ABORTED, registered([beat](Env& e) {
                 v1::HeartbeatRequest r = BeatReq(e, 0);
                 r.set_incarnation("an-older-process");
                 return beat(e, *e.run_client, r);
               })});
  t.push_back({"RendezvousService.Heartbeat", Code::FAILED_PRECONDITION, registered([beat](Env& e) {
                 v1::HeartbeatRequest r = BeatReq(e, 0);
                 r.set_generation(3);
                 return beat(e, *e.run_client, r);
               })});
  RunScoped(t, "RendezvousService.Heartbeat", [beat](Env& e, CoordinatorClient& c, const std::string& run) {
    e.Register();
    v1::HeartbeatRequest r = BeatReq(e, 0);
    r.set_run_id(run);
    return beat(e, c, r);
  });

  auto error = [](Env&, CoordinatorClient& c, const v1::ReportErrorRequest& r) {
    return Raw(c, &v1::RendezvousService::Stub::ReportError, c.rendezvous(), r);
  };
  t.push_back({"RendezvousService.ReportError", Code::OK,
               registered([error](Env& e) { return error(e, *e.run_client, ErrorReq(e, 1)); })});
  t.push_back({"RendezvousService.ReportError", Code::INVALID_ARGUMENT, registered([error](Env& e) {
                 v1::ReportErrorRequest r = ErrorReq(e, 1);
                 r.set_message("");
                 return error(e, *e.run_client, r);
               })});
  t.push_back({"RendezvousService.ReportError", Code::ABORTED, registered([error](Env& e) {
                 e.FailGeneration();  // generation 0 has ended
                 return error(e, *e.run_client, ErrorReq(e, 0));
               })});
  t.push_back({"RendezvousService.ReportError", Code::FAILED_PRECONDITION, registered([error](Env& e) {
                 v1::ReportErrorRequest r = ErrorReq(e, 1);
                 r.set_generation(4);
                 return error(e, *e.run_client, r);
               })});
  RunScoped(t, "RendezvousService.ReportError", [error](Env& e, CoordinatorClient& c, const std::string& run) {
    e.Register();
    v1::ReportErrorRequest r = ErrorReq(e, 1);
    r.set_run_id(run);
    return error(e, c, r);
  });

  // ReportStopped, ReportPreflight and Leave: the same shape.
  struct RankCall {
    std::string rpc;
    std::function<Code(Env&, CoordinatorClient&, const std::string& run, int64_t generation, const std::string& inc,
                       bool bad_field)>
        call;
  };
  std::vector<RankCall> rank_calls = {
      {"RendezvousService.ReportStopped",
       [](Env& e, CoordinatorClient& c, const std::string& run, int64_t gen, const std::string& inc, bool bad) {
         v1::ReportStoppedRequest r = StoppedReq(e, 0, inc);
         r.set_run_id(run);
         r.set_generation(gen);
         if (bad) r.set_signal(0);
         return Raw(c, &v1::RendezvousService::Stub::ReportStopped, c.rendezvous(), r);
       }},
      {"RendezvousService.ReportPreflight",
       [](Env& e, CoordinatorClient& c, const std::string& run, int64_t gen, const std::string& inc, bool bad) {
         v1::ReportPreflightRequest r = PreflightReq(e, 0, inc);
         r.set_run_id(run);
         r.set_generation(gen);
         if (bad) r.mutable_result()->set_matmul_seconds(-1);
         return Raw(c, &v1::RendezvousService::Stub::ReportPreflight, c.rendezvous(), r);
       }},
      {"RendezvousService.Leave",
       [](Env& e, CoordinatorClient& c, const std::string& run, int64_t gen, const std::string& inc, bool bad) {
         v1::LeaveRequest r = LeaveReq(e, 0, inc);
         r.set_run_id(run);
         r.set_generation(gen);
         if (bad) r.set_final_step(-1);
         return Raw(c, &v1::RendezvousService::Stub::Leave, c.rendezvous(), r);
       }},
  };
  for (const RankCall& rc : rank_calls) {
    auto call = rc.call;
    t.push_back({rc.rpc, Code::OK, [call](Env& e) {
                   e.Register();
                   return call(e, *e.run_client, e.run.run_id(), 0, e.ranks[0]->incarnation(), false);
                 }});
    t.push_back({rc.rpc, Code::INVALID_ARGUMENT, [call](Env& e) {
                   e.Register();
                   return call(e, *e.run_client, e.run.run_id(), 0, e.ranks[0]->incarnation(), true);
                 }});
    t.push_back({rc.rpc, Code::ABORTED, [call](Env& e) {
                   e.Register();
                   return call(e, *e.run_client, e.run.run_id(), 0, "an-older-process", false);
                 }});
    t.push_back({rc.rpc, Code::FAILED_PRECONDITION, [call](Env& e) {
                   // Registered but the rendezvous is not complete: no rank is assigned yet.
                   std::unique_ptr<Agent> one = e.MakeAgent(0);
                   std::thread waiting([&] { (void)one->Register(absl::Seconds(10)); });
                   e.AwaitWaiting(1);
                   Code c = call(e, *e.run_client, e.run.run_id(), 0, "whoever", false);
                   e.Cancel();  // ends the waiting registration
                   waiting.join();
                   return c;
                 }});
    RunScoped(t, rc.rpc, [call](Env& e, CoordinatorClient& c, const std::string& run) {
      e.Register();
      return call(e, c, run, 0, e.ranks[0]->incarnation(), false);
    });
  }
}

void BarrierRpcs(std::vector<Case>& t) {
  auto barrier = [](Env&, CoordinatorClient& c, const v1::BarrierRequest& r) {
    return Raw(c, &v1::BarrierService::Stub::Barrier, c.barriers(), r);
  };
  const std::string rpc = "BarrierService.Barrier";
  t.push_back({rpc, Code::OK, [barrier](Env& e) {
                 e.Register();
                 std::thread other([&] { (void)barrier(e, *e.run_client, BarrierReq(e, 1)); });
                 Code c = barrier(e, *e.run_client, BarrierReq(e, 0));
                 other.join();
                 return c;
               }});
  t.push_back({rpc, Code::INVALID_ARGUMENT, [barrier](Env& e) {
                 e.Register();
                 v1::BarrierRequest r = BarrierReq(e, 0);
                 r.set_name("bad\nname");
                 return barrier(e, *e.run_client, r);
               }});
  t.push_back({rpc, Code::DEADLINE_EXCEEDED, [barrier](Env& e) {
                 e.Register();
                 return barrier(e, *e.run_client, BarrierReq(e, 0, /*timeout_ms=*/200));
               }});
  t.push_back({rpc, Code::ABORTED, [barrier](Env& e) {
                 e.Register();
                 return e.WhileWaiting([&] { return barrier(e, *e.run_client, BarrierReq(e, 0)); },
                                       [&] { e.FailGeneration(); });
               }});
  t.push_back({rpc, Code::CANCELLED, [](Env& e) {
                 e.Register();
                 grpc::ClientContext* ctx = nullptr;
                 absl::Notification started;
                 std::atomic<int> code{-1};
                 std::thread waiter([&] {
                   std::unique_ptr<grpc::ClientContext> own = e.run_client->Context(absl::Seconds(10));
                   ctx = own.get();
                   started.Notify();
                   v1::BarrierResponse response;
                   code = static_cast<int>(
                       e.run_client->barriers().Barrier(own.get(), BarrierReq(e, 0), &response).error_code());
                 });
                 started.WaitForNotification();
                 e.AwaitWaiting(1);
                 ctx->TryCancel();
                 waiter.join();
                 return static_cast<Code>(code.load());
               }});
  t.push_back({rpc, Code::FAILED_PRECONDITION, [barrier](Env& e) {
                 e.Register();
                 v1::BarrierRequest r = BarrierReq(e, 0);
                 r.set_generation(6);
                 return barrier(e, *e.run_client, r);
               }});
  t.push_back({rpc, Code::RESOURCE_EXHAUSTED, [barrier](Env& e) {
                 e.Register();
                 for (int n = 0; n < kBarrierNames; ++n) {
                   v1::BarrierRequest r = BarrierReq(e, 0, /*timeout_ms=*/1);
                   r.set_name(absl::StrCat("step-", n));
                   if (barrier(e, *e.run_client, r) != Code::DEADLINE_EXCEEDED) return Code::INTERNAL;
                 }
                 return barrier(e, *e.run_client, BarrierReq(e, 0));
               }});
  t.push_back({rpc, Code::UNAVAILABLE, [barrier](Env& e) {
                 e.Register();
                 return e.WhileWaiting([&] { return barrier(e, *e.run_client, BarrierReq(e, 0)); },
                                       [&] { e.Shutdown(); });
               }});
  RunScoped(t, rpc, [barrier](Env& e, CoordinatorClient& c, const std::string& run) {
    e.Register();
    v1::BarrierRequest r = BarrierReq(e, 0);
    r.set_run_id(run);
    return barrier(e, c, r);
  });
}

void CheckpointRpcs(std::vector<Case>& t) {
  auto begin = [](Env&, CoordinatorClient& c, const v1::BeginCheckpointRequest& r) {
    return Raw(c, &v1::CheckpointService::Stub::BeginCheckpoint, c.checkpoints(), r);
  };
  const std::string b = "CheckpointService.BeginCheckpoint";
  t.push_back({b, Code::OK, [](Env& e) {
                 e.Register();
                 return OpenRound(e).round_id().empty() ? Code::UNKNOWN : Code::OK;
               }});
  t.push_back({b, Code::INVALID_ARGUMENT, [begin](Env& e) {
                 e.Register();
                 Code no_step = begin(e, *e.run_client, BeginReq(e, 0, /*step=*/0));
                 // A wait past kMaxWaitMs, refused as every call's is.
                 Code long_wait = begin(e, *e.run_client, BeginReq(e, 0, /*step=*/5, /*timeout_ms=*/kMaxWaitMs + 1));
                 return no_step == long_wait ? no_step : Code::UNKNOWN;
               }});
  t.push_back({b, Code::FAILED_PRECONDITION, [begin](Env& e) {
                 e.Register();
                 // The ranks ask for different steps.
                 std::thread first([&] { (void)begin(e, *e.run_client, BeginReq(e, 0, 5)); });
                 e.AwaitWaiting(1);
                 Code c = begin(e, *e.run_client, BeginReq(e, 1, 6));
                 first.join();
                 return c;
               }});
  t.push_back({b, Code::DEADLINE_EXCEEDED, [begin](Env& e) {
                 e.Register();
                 return begin(e, *e.run_client, BeginReq(e, 0, 5, /*timeout_ms=*/200));
               }});
  t.push_back({b, Code::ABORTED, [begin](Env& e) {
                 e.Register();
                 return e.WhileWaiting([&] { return begin(e, *e.run_client, BeginReq(e, 0)); },
                                       [&] { e.FailGeneration(); });
               }});
  t.push_back({b, Code::UNAVAILABLE, [begin](Env& e) {
                 e.Register();
                 return e.WhileWaiting([&] { return begin(e, *e.run_client, BeginReq(e, 0)); }, [&] { e.Shutdown(); });
               }});
  RunScoped(t, b, [begin](Env& e, CoordinatorClient& c, const std::string& run) {
    e.Register();
    v1::BeginCheckpointRequest r = BeginReq(e, 0);
    r.set_run_id(run);
    return begin(e, c, r);
  });

  auto commit = [](Env&, CoordinatorClient& c, const v1::CommitCheckpointRequest& r) {
    return Raw(c, &v1::CheckpointService::Stub::CommitCheckpoint, c.checkpoints(), r);
  };
  const std::string c = "CheckpointService.CommitCheckpoint";
  // The writer's commit with `manifest`, the other rank's commit waiting meanwhile.
  auto writer_commit = [commit](Env& e, bool corrupt) {
    e.Register();
    v1::BeginCheckpointResponse round = OpenRound(e);
    v1::CommitCheckpointRequest w = CommitReq(e, round.writer_rank(), round.round_id());
    *w.mutable_manifest() = WriteOneFile(round, corrupt);
    std::thread other([&] { (void)commit(e, *e.run_client, CommitReq(e, 1 - round.writer_rank(), round.round_id())); });
    Code code = commit(e, *e.run_client, w);
    other.join();
    return code;
  };
  t.push_back({c, Code::OK, [writer_commit](Env& e) { return writer_commit(e, false); }});
  t.push_back({c, Code::DATA_LOSS, [writer_commit](Env& e) { return writer_commit(e, true); }});
  t.push_back({c, Code::INVALID_ARGUMENT, [commit](Env& e) {
                 e.Register();
                 return commit(e, *e.run_client, CommitReq(e, 0, "no-such-round"));
               }});
  t.push_back({c, Code::ABORTED, [commit](Env& e) {
                 e.Register();
                 v1::BeginCheckpointResponse round = OpenRound(e);
                 int other = 1 - round.writer_rank();
                 return e.WhileWaiting([&] { return commit(e, *e.run_client, CommitReq(e, other, round.round_id())); },
                                       [&] {
                                         (void)Raw(*e.run_client, &v1::CheckpointService::Stub::AbortCheckpoint,
                                                   e.run_client->checkpoints(),
                                                   AbortReq(e, round.writer_rank(), round.round_id()));
                                       });
               }});
  t.push_back({c, Code::CANCELLED, [commit](Env& e) {
                 // A retry of a waiting commit replaces it.
                 e.Register();
                 v1::BeginCheckpointResponse round = OpenRound(e);
                 int other = 1 - round.writer_rank();
                 return e.WhileWaiting([&] { return commit(e, *e.run_client, CommitReq(e, other, round.round_id())); },
                                       [&] {
                                         e.background.emplace_back([&e, commit, other, round] {
                                           (void)commit(e, *e.run_client, CommitReq(e, other, round.round_id()));
                                         });
                                       });
               }});
  t.push_back({c, Code::FAILED_PRECONDITION, [commit](Env& e) {
                 e.Register();
                 v1::CommitCheckpointRequest r = CommitReq(e, 0, "r");
                 r.set_generation(7);
                 return commit(e, *e.run_client, r);
               }});
  t.push_back({c, Code::UNAVAILABLE, [commit](Env& e) {
                 e.Register();
                 v1::BeginCheckpointResponse round = OpenRound(e);
                 int other = 1 - round.writer_rank();
                 return e.WhileWaiting([&] { return commit(e, *e.run_client, CommitReq(e, other, round.round_id())); },
                                       [&] { e.Shutdown(); });
               }});
  RunScoped(t, c, [commit](Env& e, CoordinatorClient& cl, const std::string& run) {
    e.Register();
    v1::CommitCheckpointRequest r = CommitReq(e, 0, "r");
    r.set_run_id(run);
    return commit(e, cl, r);
  });

  auto abort = [](Env&, CoordinatorClient& cl, const v1::AbortCheckpointRequest& r) {
    return Raw(cl, &v1::CheckpointService::Stub::AbortCheckpoint, cl.checkpoints(), r);
  };
  const std::string a = "CheckpointService.AbortCheckpoint";
  t.push_back({a, Code::OK, [abort](Env& e) {
                 e.Register();
                 v1::BeginCheckpointResponse round = OpenRound(e);
                 return abort(e, *e.run_client, AbortReq(e, round.writer_rank(), round.round_id()));
               }});
  t.push_back({a, Code::INVALID_ARGUMENT, [abort](Env& e) {
                 e.Register();
                 return abort(e, *e.run_client, AbortReq(e, 0, "no-such-round"));
               }});
  t.push_back({a, Code::ABORTED, [abort](Env& e) {
                 e.Register();
                 e.FailGeneration();
                 return abort(e, *e.run_client, AbortReq(e, 0, "r"));
               }});
  t.push_back({a, Code::FAILED_PRECONDITION, [abort](Env& e) {
                 e.Register();
                 v1::AbortCheckpointRequest r = AbortReq(e, 0, "r");
                 r.set_generation(7);
                 return abort(e, *e.run_client, r);
               }});
  RunScoped(t, a, [abort](Env& e, CoordinatorClient& cl, const std::string& run) {
    e.Register();
    v1::AbortCheckpointRequest r = AbortReq(e, 0, "r");
    r.set_run_id(run);
    return abort(e, cl, r);
  });

  auto latest = [](Env&, CoordinatorClient& cl, const std::string& run) {
    v1::LatestCheckpointRequest r;
    r.set_run_id(run);
    return Raw(cl, &v1::CheckpointService::Stub::LatestCheckpoint, cl.checkpoints(), r);
  };
  t.push_back({"CheckpointService.LatestCheckpoint", Code::OK, [latest, writer_commit](Env& e) {
                 if (writer_commit(e, false) != Code::OK) return Code::UNKNOWN;
                 return latest(e, *e.run_client, e.run.run_id());
               }});
  t.push_back({"CheckpointService.LatestCheckpoint", Code::INVALID_ARGUMENT,
               [latest](Env& e) { return latest(e, *e.admin, kMalformedRun); }});
  RunScoped(t, "CheckpointService.LatestCheckpoint", latest);

  auto list = [](Env&, CoordinatorClient& cl, const std::string& run) {
    v1::ListCheckpointsRequest r;
    r.set_run_id(run);
    return Raw(cl, &v1::CheckpointService::Stub::ListCheckpoints, cl.checkpoints(), r);
  };
  t.push_back({"CheckpointService.ListCheckpoints", Code::OK,
               [list](Env& e) { return list(e, *e.run_client, e.run.run_id()); }});
  t.push_back({"CheckpointService.ListCheckpoints", Code::INVALID_ARGUMENT,
               [list](Env& e) { return list(e, *e.admin, kMalformedRun); }});
  RunScoped(t, "CheckpointService.ListCheckpoints", list);

  auto experiment = [](Env&, CoordinatorClient& cl, const std::string& run) {
    v1::GetExperimentRequest r;
    r.set_run_id(run);
    return Raw(cl, &v1::ExperimentService::Stub::GetExperiment, cl.experiments(), r);
  };
  t.push_back({"ExperimentService.GetExperiment", Code::OK,
               [experiment](Env& e) { return experiment(e, *e.run_client, e.run.run_id()); }});
  t.push_back({"ExperimentService.GetExperiment", Code::INVALID_ARGUMENT,
               [experiment](Env& e) { return experiment(e, *e.admin, kMalformedRun); }});
  RunScoped(t, "ExperimentService.GetExperiment", experiment);
}

void MetricsRpcs(std::vector<Case>& t) {
  const std::string r = "MetricsService.ReportMetrics";
  t.push_back({r, Code::OK, [](Env& e) { return ReportMetrics(*e.run_client, {Batch(e.run.run_id(), 0, 0)}); }});
  t.push_back(
      {r, Code::INVALID_ARGUMENT, [](Env& e) { return ReportMetrics(*e.run_client, {Batch(e.run.run_id(), 0, 9)}); }});
  t.push_back({r, Code::RESOURCE_EXHAUSTED,
               [](Env& e) { return ReportMetrics(*e.run_client, {Batch(e.run.run_id(), 0, 0, 1100 * 1024)}); }});
  t.push_back({r, Code::FAILED_PRECONDITION,
               [](Env& e) { return ReportMetrics(*e.run_client, {Batch(e.run.run_id(), 8, 0)}); }});
  // A state database that cannot take the write: another connection holds its write lock for
  // longer than the coordinator's busy timeout (5 s), as a failing or hung disk would.
  t.push_back({r, Code::INTERNAL, [](Env& e) {
                 testing::StateDbWriteLock disk_stall(e.tmp.Sub("state"));
                 return disk_stall.held() ? ReportMetrics(*e.run_client, {Batch(e.run.run_id(), 0, 0)}) : Code::UNKNOWN;
               }});
  // The coordinator shutting down (its server still answering): batches are refused.
  t.push_back({r, Code::UNAVAILABLE, [](Env& e) {
                 e.coord->coordinator().Shutdown();
                 return ReportMetrics(*e.run_client, {Batch(e.run.run_id(), 0, 0)});
               }});
  RunScoped(t, r,
            [](Env&, CoordinatorClient& c, const std::string& run) { return ReportMetrics(c, {Batch(run, 0, 0)}); });

  auto query = [](Env&, CoordinatorClient& c, const std::string& run, int limit) {
    v1::QueryMetricsRequest q;
    q.set_run_id(run);
    q.set_limit(limit);
    return Raw(c, &v1::MetricsService::Stub::QueryMetrics, c.metrics(), q);
  };
  const std::string q = "MetricsService.QueryMetrics";
  t.push_back({q, Code::OK, [query](Env& e) { return query(e, *e.run_client, e.run.run_id(), 10); }});
  t.push_back({q, Code::INVALID_ARGUMENT, [query](Env& e) { return query(e, *e.run_client, e.run.run_id(), -1); }});
  RunScoped(t, q, [query](Env& e, CoordinatorClient& c, const std::string& run) { return query(e, c, run, 10); });
}

// One unary store RPC: its request (with the scope) built by `make`, valid or (bad) not.
struct StoreRpc {
  std::string rpc;
  std::function<Code(CoordinatorClient&, const v1::StoreScope&, bool bad)> call;
  bool blocks = false;    // get and wait: DEADLINE_EXCEEDED and UNAVAILABLE
  bool grows = false;     // set, add, compare_set: RESOURCE_EXHAUSTED
  bool validates = true;  // has a field that can be malformed
};

template <typename Request, typename Response>
std::function<Code(CoordinatorClient&, const v1::StoreScope&, bool)> StoreCall(
    grpc::Status (v1::StoreService::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    std::function<void(Request&, bool)> fill) {
  return [method, fill](CoordinatorClient& c, const v1::StoreScope& scope, bool bad) {
    Request r;
    *r.mutable_scope() = scope;
    fill(r, bad);
    return Raw(c, method, c.store(), r);
  };
}

std::vector<StoreRpc> StoreRpcsTable() {
  using S = v1::StoreService::Stub;
  return {
      {"StoreService.Set",
       StoreCall<v1::StoreSetRequest, v1::StoreSetResponse>(&S::Set,
                                                            [](v1::StoreSetRequest& r, bool bad) {
                                                              r.set_key(bad ? "" : "k");
                                                              r.set_value("1");
                                                            }),
       false, true},
      {"StoreService.Get",
       StoreCall<v1::StoreGetRequest, v1::StoreGetResponse>(&S::Get,
                                                            [](v1::StoreGetRequest& r, bool bad) {
                                                              r.set_key("absent");
                                                              r.set_timeout_ms(bad ? -1 : 300);
                                                            }),
       true, false},
      {"StoreService.Add",
       StoreCall<v1::StoreAddRequest, v1::StoreAddResponse>(&S::Add,
                                                            [](v1::StoreAddRequest& r, bool bad) {
                                                              r.set_key(bad ? "" : "n");
                                                              r.set_delta(1);
                                                            }),
       false, true},
      {"StoreService.CompareSet",
       StoreCall<v1::StoreCompareSetRequest, v1::StoreCompareSetResponse>(&S::CompareSet,
                                                                          [](v1::StoreCompareSetRequest& r, bool bad) {
                                                                            r.set_key(bad ? "" : "c");
                                                                            r.set_desired("d");
                                                                          }),
       false, true},
      {"StoreService.Check",
       StoreCall<v1::StoreCheckRequest, v1::StoreCheckResponse>(
           &S::Check, [](v1::StoreCheckRequest& r, bool bad) { r.add_keys(bad ? "" : "k"); }),
       false, false},
      {"StoreService.Wait",
       StoreCall<v1::StoreWaitRequest, v1::StoreWaitResponse>(&S::Wait,
                                                              [](v1::StoreWaitRequest& r, bool bad) {
                                                                r.add_keys("absent");
                                                                r.set_timeout_ms(bad ? -1 : 300);
                                                              }),
       true, false},
      {"StoreService.DeleteKey",
       StoreCall<v1::StoreDeleteKeyRequest, v1::StoreDeleteKeyResponse>(
           &S::DeleteKey, [](v1::StoreDeleteKeyRequest& r, bool bad) { r.set_key(bad ? "" : "k"); }),
       false, false},
      {"StoreService.NumKeys",
       StoreCall<v1::StoreNumKeysRequest, v1::StoreNumKeysResponse>(&S::NumKeys, [](v1::StoreNumKeysRequest&, bool) {}),
       false, false, false},
  };
}

void StoreRpcs(std::vector<Case>& t) {
  for (const StoreRpc& s : StoreRpcsTable()) {
    auto call = s.call;
    bool blocks = s.blocks;
    // A get or wait of a key that never comes answers DEADLINE_EXCEEDED; the others OK.
    t.push_back({s.rpc, Code::OK, [call, blocks](Env& e) {
                   Code c = call(*e.run_client, Scope(e.run.run_id()), false);
                   return blocks && c == Code::DEADLINE_EXCEEDED ? Code::OK : c;
                 }});
    if (s.validates) {
      t.push_back(
          {s.rpc, Code::INVALID_ARGUMENT, [call](Env& e) { return call(*e.run_client, Scope(e.run.run_id()), true); }});
    }
    t.push_back({s.rpc, Code::ABORTED, [call](Env& e) {
                   e.Register();
                   e.FailGeneration();  // generation 0 has ended
                   return call(*e.run_client, Scope(e.run.run_id(), 0), false);
                 }});
    t.push_back({s.rpc, Code::FAILED_PRECONDITION,
                 [call](Env& e) { return call(*e.run_client, Scope(e.run.run_id(), 5), false); }});
    if (s.blocks) {
      t.push_back({s.rpc, Code::DEADLINE_EXCEEDED,
                   [call](Env& e) { return call(*e.run_client, Scope(e.run.run_id()), false); }});
      t.push_back({s.rpc, Code::UNAVAILABLE, [](Env& e) {
                     return e.WhileWaiting(
                         [&] {
                           v1::StoreWaitRequest r;
                           *r.mutable_scope() = Scope(e.run.run_id());
                           r.add_keys("absent");
                           return Raw(*e.run_client, &v1::StoreService::Stub::Wait, e.run_client->store(), r);
                         },
                         [&] { e.Shutdown(); });
                   }});
    }
    if (s.grows) {
      t.push_back({s.rpc, Code::RESOURCE_EXHAUSTED, [call](Env& e) {
                     // The run's store budget filled to the byte: the operation's new key does not fit.
                     v1::StoreSetRequest r;
                     *r.mutable_scope() = Scope(e.run.run_id());
                     r.set_key("fill");
                     r.set_value(std::string(kStoreBytes - 4, 'v'));
                     if (Raw(*e.run_client, &v1::StoreService::Stub::Set, e.run_client->store(), r) != Code::OK) {
                       return Code::UNKNOWN;
                     }
                     return call(*e.run_client, Scope(e.run.run_id()), false);
                   }});
    }
    RunScoped(t, s.rpc,
              [call](Env&, CoordinatorClient& c, const std::string& run) { return call(c, Scope(run), false); });
  }

  const std::string s = "StoreService.Session";
  t.push_back({s, Code::OK, [](Env& e) { return Session(*e.run_client, Scope(e.run.run_id())); }});
  t.push_back({s, Code::INVALID_ARGUMENT,
               [](Env& e) { return Session(*e.run_client, Scope(e.run.run_id()), /*open_first=*/false); }});
  t.push_back({s, Code::ABORTED, [](Env& e) {
                 e.Register();
                 e.FailGeneration();
                 return Session(*e.run_client, Scope(e.run.run_id(), 0));
               }});
  t.push_back({s, Code::FAILED_PRECONDITION, [](Env& e) { return Session(*e.run_client, Scope(e.run.run_id(), 5)); }});
  t.push_back({s, Code::UNAVAILABLE,
               [](Env& e) { return Session(*e.run_client, Scope(e.run.run_id()), true, [&e] { e.Shutdown(); }); }});
  RunScoped(t, s, [](Env&, CoordinatorClient& c, const std::string& run) { return Session(c, Scope(run)); });
}

v1::ReportStacksRequest StacksReq(const Env& e, int rank, const std::string& incarnation, const std::string& capture) {
  v1::ReportStacksRequest r = RankReq<v1::ReportStacksRequest>(e, rank);
  r.set_incarnation(incarnation);
  r.set_capture_id(capture);
  return r;
}

// A live capture of `run` waiting on another thread (joined by the Env); the id its heartbeat
// reply names.
std::string StartLiveCapture(Env& e) {
  e.background.emplace_back([&e] {
    v1::CaptureStacksRequest r;
    r.set_run_id(e.run.run_id());
    (void)Raw(*e.run_client, &v1::StacksService::Stub::CaptureStacks, e.run_client->stacks(), r);
  });
  std::string id;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        absl::StatusOr<v1::HeartbeatResponse> b = Call(*e.run_client, &v1::RendezvousService::Stub::Heartbeat,
                                                       e.run_client->rendezvous(), BeatReq(e, 0), absl::Seconds(5));
        if (b.ok()) id = b->capture_id();
        return !id.empty();
      },
      absl::Seconds(10)));
  return id;
}

void StacksRpcs(std::vector<Case>& t) {
  const std::string report = "StacksService.ReportStacks";
  auto send = [](CoordinatorClient& c, const v1::ReportStacksRequest& r) {
    return Raw(c, &v1::StacksService::Stub::ReportStacks, c.stacks(), r);
  };
  t.push_back({report, Code::OK, [send](Env& e) {
                 e.Register();
                 std::string id = StartLiveCapture(e);
                 return send(*e.run_client, StacksReq(e, 0, e.ranks[0]->incarnation(), id));
               }});
  t.push_back({report, Code::INVALID_ARGUMENT, [send](Env& e) {
                 e.Register();
                 return send(*e.run_client, StacksReq(e, 0, e.ranks[0]->incarnation(), ""));
               }});
  t.push_back({report, Code::ABORTED, [send](Env& e) {
                 e.Register();
                 return send(*e.run_client, StacksReq(e, 0, "an-older-process", "cap-none"));
               }});
  t.push_back({report, Code::FAILED_PRECONDITION, [send](Env& e) {
                 std::unique_ptr<Agent> one = e.MakeAgent(0);
                 std::thread waiting([&] { (void)one->Register(absl::Seconds(10)); });
                 e.AwaitWaiting(1);
                 Code c = send(*e.run_client, StacksReq(e, 0, "whoever", "cap-none"));
                 e.Cancel();
                 waiting.join();
                 return c;
               }});
  RunScoped(t, report, [send](Env& e, CoordinatorClient& c, const std::string& run) {
    e.Register();
    v1::ReportStacksRequest r = StacksReq(e, 0, e.ranks[0]->incarnation(), "cap-none");
    r.set_run_id(run);
    return send(c, r);
  });

  const std::string capture = "StacksService.CaptureStacks";
  auto live = [](CoordinatorClient& c, const std::string& run) {
    v1::CaptureStacksRequest r;
    r.set_run_id(run);
    return Raw(c, &v1::StacksService::Stub::CaptureStacks, c.stacks(), r);
  };
  t.push_back({capture, Code::OK, [live](Env& e) {
                 e.Register();
                 return e.WhileWaiting(
                     [&] { return live(*e.run_client, e.run.run_id()); },
                     [&] {
                       for (int rank = 0; rank < 2; ++rank) {
                         v1::HeartbeatRequest b = BeatReq(e, rank);
                         absl::StatusOr<v1::HeartbeatResponse> got =
                             Call(*e.run_client, &v1::RendezvousService::Stub::Heartbeat, e.run_client->rendezvous(), b,
                                  absl::Seconds(5));
                         ASSERT_TRUE(got.ok());
                         (void)Raw(*e.run_client, &v1::StacksService::Stub::ReportStacks, e.run_client->stacks(),
                                   StacksReq(e, rank, e.ranks[rank]->incarnation(), got->capture_id()));
                       }
                     });
               }});
  t.push_back({capture, Code::INVALID_ARGUMENT, [live](Env& e) { return live(*e.admin, kMalformedRun); }});
  t.push_back({capture, Code::FAILED_PRECONDITION, [live](Env& e) { return live(*e.run_client, e.run.run_id()); }});
  t.push_back({capture, Code::UNAVAILABLE, [live](Env& e) {
                 e.Register();
                 return e.WhileWaiting([&] { return live(*e.run_client, e.run.run_id()); }, [&] { e.Shutdown(); });
               }});
  RunScoped(t, capture, [live](Env&, CoordinatorClient& c, const std::string& run) { return live(c, run); });

  const std::string get = "StacksService.GetStacks";
  auto stored = [](CoordinatorClient& c, const std::string& run, int64_t generation) {
    v1::GetStacksRequest r;
    r.set_run_id(run);
    r.set_generation(generation);
    return Raw(c, &v1::StacksService::Stub::GetStacks, c.stacks(), r);
  };
  t.push_back({get, Code::OK, [stored](Env& e) { return stored(*e.run_client, e.run.run_id(), 0); }});
  t.push_back({get, Code::INVALID_ARGUMENT, [stored](Env& e) { return stored(*e.run_client, e.run.run_id(), -1); }});
  RunScoped(t, get, [stored](Env&, CoordinatorClient& c, const std::string& run) { return stored(c, run, 0); });
}

std::vector<Case> Table() {
  std::vector<Case> t;
  StacksRpcs(t);
  RunRpcs(t);
  RendezvousRpcs(t);
  NodeRpcs(t);
  BarrierRpcs(t);
  CheckpointRpcs(t);
  MetricsRpcs(t);
  StoreRpcs(t);
  return t;
}

// ---- The tests ----------------------------------------------------------------------------

void PrintTo(const Case& c, std::ostream* os) { *os << c.rpc << " " << CodeName(c.code); }

class StatusCodeTest : public ::testing::TestWithParam<Case> {};

TEST_P(StatusCodeTest, IsProvoked) {
  const Case& c = GetParam();
  Env env(c.rendezvous_timeout);
  Code got = c.provoke(env);
  EXPECT_EQ(CodeName(got), CodeName(c.code)) << c.rpc;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name = absl::StrCat(info.param.rpc, "_", CodeName(info.param.code));
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryListedCode, StatusCodeTest, ::testing::ValuesIn(Table()), CaseName);

// The (RPC, code) pairs each RPC's comment in proto/dt/v1 lists: the codes named from the line
// that starts its list ("//   OK ...") to the end of the comment.
std::set<std::pair<std::string, std::string>> DocumentedCodes() {
  static const std::regex code_word(
      "\\b(OK|CANCELLED|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|"
      "RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED)\\b");
  static const std::regex list_line("^//\\s+(OK|[A-Z_]+)(\\s|;|$|\\s*/)");
  static const std::regex service_line("^service (\\w+)");
  static const std::regex rpc_line("^rpc (\\w+)\\(");
  std::set<std::pair<std::string, std::string>> out;
  for (const char* file : {"runs", "rendezvous", "barrier", "checkpoint", "experiment", "metrics", "store", "stacks"}) {
    std::ifstream in(JoinPath(DT_SOURCE_DIR, absl::StrCat("proto/dt/v1/", file, ".proto")));
    std::string service, line;
    std::vector<std::string> comment;
    while (std::getline(in, line)) {
      std::string s = std::string(absl::StripAsciiWhitespace(line));
      std::smatch m;
      if (std::regex_search(s, m, service_line)) service = m[1];
      if (absl::StartsWith(s, "//")) {
        comment.push_back(s);
        continue;
      }
      if (std::regex_search(s, m, rpc_line)) {
        bool in_list = false;
        for (const std::string& c : comment) {
          std::smatch first;
          in_list = in_list || (std::regex_search(c, first, list_line) && first[1] == "OK");
          if (!in_list) continue;
          for (auto it = std::sregex_iterator(c.begin(), c.end(), code_word); it != std::sregex_iterator(); ++it) {
            out.insert({absl::StrCat(service, ".", m[1].str()), (*it)[1]});
          }
        }
      }
      comment.clear();
    }
  }
  return out;
}

TEST(StatusCodeDocs, TheProtosListExactlyTheCodesTheTableProvokes) {
  std::set<std::pair<std::string, std::string>> documented = DocumentedCodes();
  std::set<std::pair<std::string, std::string>> provoked;
  for (const Case& c : Table()) provoked.insert({c.rpc, CodeName(c.code)});
  ASSERT_GT(documented.size(), 100u) << "the proto comments could not be read";
  for (const auto& [rpc, code] : documented) {
    EXPECT_TRUE(provoked.count({rpc, code})) << rpc << " documents " << code << " but no case provokes it";
  }
  for (const auto& [rpc, code] : provoked) {
    EXPECT_TRUE(documented.count({rpc, code})) << rpc << " returns " << code << " but its comment does not list it";
  }
}

}  // namespace
}  // namespace dt
