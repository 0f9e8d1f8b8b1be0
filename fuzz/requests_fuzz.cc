// Every RPC's validation on a live coordinator (its logic, as the services call it, on a fake
// clock): a sequence of requests of any shape — proto wire bytes, or protobuf text in the seed
// corpus — is answered with a status a person can act on, and loses nothing: afterwards the run
// the fuzzer submitted is still there, every run reads back as a well-formed message, and a
// coordinator reopened on the same database loads the same runs.
#include <google/protobuf/text_format.h>
#include <stdlib.h>

#include <cstdint>
#include <memory>

#include "common/fs.h"
#include "common/log.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_monitor.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/rank_registration.h"
#include "coordinator/state_db.h"
#include "coordinator/store_barriers.h"
#include "coordinator/store_ops.h"
#include "coordinator/timer_queue.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_coordinator.h"
#include "fuzz/requests.pb.h"

namespace dt::fuzz {
namespace {

using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kMaxCalls = 64;

const std::string& BaseDir() {
  static const std::string* dir = new std::string(MakeScratchDir("requests"));
  return *dir;
}

// Run ids spelled "@" become the fuzzer's run; every save_dir stays in the scratch directory.
void Bind(Message& m, const std::string& run_id) {
  const Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING && !f->is_repeated()) {
      if (f->name() == "run_id" && r->GetString(m, f) == "@") r->SetString(&m, f, run_id);
      if (f->name() == "save_dir") r->SetString(&m, f, JoinPath(BaseDir(), "runs"));
    } else if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(m, f); ++j) Bind(*r->MutableRepeatedMessage(&m, f, j), run_id);
      } else if (r->HasField(m, f)) {
        Bind(*r->MutableMessage(&m, f), run_id);
      }
    }
  }
}

// A message the coordinator hands out must survive the wire (proto3 strings are UTF-8).
void CheckWellFormed(const Message& m, const std::string& what) {
  std::string wire;
  Check(m.SerializeToString(&wire), what + " does not serialize");
  std::unique_ptr<Message> back(m.New());
  Check(back->ParseFromString(wire), what + " does not parse back (invalid UTF-8 in a string?)");
}

template <typename T>
void Answered(const absl::StatusOr<T>& r, const std::string& rpc) {
  CheckRefusal(r.status(), rpc);
  if (r.ok()) {
    if constexpr (std::is_base_of_v<Message, T>) CheckWellFormed(*r, rpc + "'s answer");
  }
}
void Answered(const absl::Status& s, const std::string& rpc) { CheckRefusal(s, rpc); }

template <typename T>
PendingPtr<T> Later(const std::string& rpc) {
  return MakePending<T>([rpc](absl::StatusOr<T> r) { Answered(r, rpc); });
}

struct World : FuzzCoordinator {
  std::string run_id;
  std::shared_ptr<KvStore> store;
  Deferred deferred;  // store operations' completions

  absl::Status Open() { return FuzzCoordinator::Open(BaseDir()); }

  void Close() {
    store.reset();
    deferred.RunNow();
    FuzzCoordinator::Close();
  }
};

void Apply(World& w, Call& call) {
  Bind(call, w.run_id);
  Coordinator& c = *w.coordinator;
  switch (call.rpc_case()) {
    case Call::kSubmitRun:
      return Answered(c.SubmitRun(call.submit_run().spec()), "SubmitRun");
    case Call::kGetRun:
      return Answered(c.GetRun(call.get_run().run_id()), "GetRun");
    case Call::kListRuns: {
      std::vector<v1::RunState> states;
      for (int s : call.list_runs().states()) states.push_back(static_cast<v1::RunState>(s));
      absl::StatusOr<Coordinator::RunPage> runs =
          c.ListRuns(call.list_runs().limit(), states, call.list_runs().page_token());
      CheckRefusal(runs.status(), "ListRuns");
      if (runs.ok()) {
        for (const v1::Run& r : runs->runs) CheckWellFormed(r, "a listed run");
      }
      return;
    }
    case Call::kCancelRun:
      return Answered(c.CancelRun(call.cancel_run().run_id(), call.cancel_run().reason()), "CancelRun");
    case Call::kAttachLaunch:
      return Answered(c.AttachLaunch(call.attach_launch()), "AttachLaunch");
    case Call::kExcludeNodes:
      return Answered(c.ExcludeNodes(call.exclude_nodes()), "ExcludeNodes");
    case Call::kGetExperiment:
      return Answered(c.GetExperiment(call.get_experiment().run_id()), "GetExperiment");
    case Call::kRegister:
      return c.registration().Register(call.register_(), Later<v1::RegisterResponse>("Register"));
    case Call::kHeartbeat:
      return Answered(c.health().Heartbeat(call.heartbeat()), "Heartbeat");
    case Call::kRegisterNode:
      return c.registration().RegisterNode(call.register_node(), Later<v1::RegisterNodeResponse>("RegisterNode"));
    case Call::kNodeHeartbeat:
      return Answered(c.health().NodeHeartbeat(call.node_heartbeat()), "NodeHeartbeat");
    case Call::kReportError:
      return Answered(c.health().ReportError(call.report_error()), "ReportError");
    case Call::kReportStopped:
      return Answered(c.health().ReportStopped(call.report_stopped()), "ReportStopped");
    case Call::kReportPreflight:
      return Answered(c.health().ReportPreflight(call.report_preflight()), "ReportPreflight");
    case Call::kLeave:
      return Answered(c.health().Leave(call.leave()), "Leave");
    case Call::kStore: {
      v1::StoreRequest& req = *call.mutable_store();
      if (req.has_open()) {
        absl::StatusOr<std::shared_ptr<KvStore>> store = c.store_barriers().OpenStore(req.open());
        Answered(store.status(), "Store open");
        if (store.ok()) w.store = *store;
        return;
      }
      if (!w.store) return;
      ApplyStoreOp(
          *w.store, c, req,
          [](v1::StoreResponse r) {
            if (r.has_status()) CheckRefusal(FromStoreStatus(r.status()), "Store");
            CheckWellFormed(r, "a store answer");
          },
          w.deferred);
      w.deferred.RunNow();
      return;
    }
    case Call::kBarrier:
      return c.store_barriers().Barrier(call.barrier(), Later<v1::BarrierResponse>("Barrier"));
    case Call::kBeginCheckpoint:
      return c.checkpoints().Begin(call.begin_checkpoint(), Later<v1::BeginCheckpointResponse>("BeginCheckpoint"));
    case Call::kCommitCheckpoint:
      return c.checkpoints().Commit(call.commit_checkpoint(), Later<v1::CommitCheckpointResponse>("CommitCheckpoint"));
    case Call::kAbortCheckpoint:
      return c.checkpoints().Abort(call.abort_checkpoint(), Later<v1::AbortCheckpointResponse>("AbortCheckpoint"));
    case Call::kLatestCheckpoint:
      return Answered(c.checkpoints().Latest(call.latest_checkpoint().run_id()), "LatestCheckpoint");
    case Call::kListCheckpoints:
      return Answered(c.checkpoints().List(call.list_checkpoints().run_id()).status(), "ListCheckpoints");
    case Call::kReportMetrics:
      return Answered(c.metrics().Ingest(call.report_metrics(), [](const absl::Status&) {}), "ReportMetrics");
    case Call::kQueryMetrics:
      return Answered(c.metrics().Query(call.query_metrics()), "QueryMetrics");
    case Call::kAdvanceMs:
      w.clock.Advance(absl::Milliseconds(std::min<uint32_t>(call.advance_ms(), 60'000)));
      w.timers.RunDue();
      c.health().CheckHealth();
      return;
    case Call::RPC_NOT_SET:
      return;
  }
}

// What every sequence must leave: the submitted run, runs that read back, a database that loads.
void CheckNothingLost(World& w) {
  absl::StatusOr<v1::Run> run = w.coordinator->GetRun(w.run_id);
  Check(run.ok(), "the submitted run is gone: " + run.status().ToString());
  CheckWellFormed(*run, "the submitted run");
  absl::StatusOr<Coordinator::RunPage> before = w.coordinator->ListRuns(0, {});
  Check(before.ok(), "ListRuns fails afterwards: " + before.status().ToString());
  w.Close();
  absl::Status reopened = w.Open();
  Check(reopened.ok(), "the database does not load again: " + reopened.ToString());
  absl::StatusOr<Coordinator::RunPage> after = w.coordinator->ListRuns(0, {});
  Check(after.ok() && after->runs.size() == before->runs.size(), "the runs read back differ after a restart");
  absl::StatusOr<v1::Run> again = w.coordinator->GetRun(w.run_id);
  Check(again.ok() && again->spec().experiment_name() == run->spec().experiment_name(),
        "the submitted run did not survive a restart");
}

}  // namespace
}  // namespace dt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dt;
  using namespace dt::fuzz;
  if (size > 64 * 1024) return 0;
  Calls calls;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (!calls.ParseFromString(bytes) && !google::protobuf::TextFormat::ParseFromString(bytes, &calls)) {
    // A seed or a regression that no longer parses tests nothing: the replay says so.
    Check(std::getenv("DT_FUZZ_REPLAY") == nullptr, "the input parses as neither wire nor text format");
    return 0;
  }
  if (calls.calls_size() > kMaxCalls) return 0;
  // What gRPC would refuse before the coordinator sees it (a proto3 string that is not UTF-8, which
  // the text format lets through) is the unparsable-request handler's business, not this target's.
  std::string wire;
  if (!calls.SerializeToString(&wire) || !Calls().ParseFromString(wire)) return 0;

  static const bool quiet = [] {
    SetMinLogLevel(LogLevel::kError);  // a line per state change would be most of the time spent
    return true;
  }();
  (void)quiet;
  (void)RemoveAll(JoinPath(BaseDir(), "runs"));
  (void)RemoveAll(JoinPath(BaseDir(), "state.db"));
  World w;
  absl::Status opened = w.Open();
  Check(opened.ok(), "a fresh coordinator does not open: " + opened.ToString());
  v1::RunSpec spec;
  spec.set_experiment_name("fuzz");
  spec.set_save_dir(JoinPath(BaseDir(), "runs"));
  spec.set_nodes(1);
  spec.set_procs_per_node(2);
  spec.set_max_restarts(1);
  absl::StatusOr<v1::SubmitRunResponse> submitted = w.coordinator->SubmitRun(spec);
  Check(submitted.ok(), "the fuzzer's run was refused: " + submitted.status().ToString());
  w.run_id = submitted->run_id();

  for (Call& call : *calls.mutable_calls()) Apply(w, call);
  CheckNothingLost(w);
  w.Close();
  return 0;
}
