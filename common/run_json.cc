#include "common/run_json.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/run_state.h"

namespace dt {

std::string Iso8601(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "";
  absl::Time at = absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", at, absl::UTCTimeZone());
}

nlohmann::json VerdictJson(const v1::HangVerdict& v) {
  nlohmann::json groups = nlohmann::json::array();
  for (const v1::StackGroup& g : v.groups()) {
    nlohmann::json frames = nlohmann::json::array();
    for (const v1::StackFrame& f : g.frames()) {
      frames.push_back({{"function", f.function()}, {"file", f.file()}, {"line", f.line()}, {"module", f.module()}});
    }
    groups.push_back(
        {{"ranks", std::vector<int>(g.ranks().begin(), g.ranks().end())}, {"odd", g.odd()}, {"frames", frames}});
  }
  return {{"summary", v.summary()},
          {"groups", groups},
          {"odd_ranks", std::vector<int>(v.odd_ranks().begin(), v.odd_ranks().end())},
          {"collectives", v.collectives()},
          {"missing_ranks", std::vector<int>(v.missing_ranks().begin(), v.missing_ranks().end())}};
}

nlohmann::json FailureJson(const v1::Failure& f) {
  nlohmann::json j = FailureFields(f);
  if (f.has_verdict()) j["verdict"] = VerdictJson(f.verdict());
  return j;
}

nlohmann::json FailureFields(const v1::Failure& f) {
  return {{"kind", v1::Failure::Kind_Name(f.kind())},
          {"rank", f.rank()},
          {"host", f.host()},
          {"node", f.node()},
          {"generation", f.generation()},
          {"step", f.step()},
          {"message", f.message()},
          {"exception_type", f.exception_type()},
          {"stack", f.stack()},
          {"summary", DescribeFailure(f)},
          {"stopped_ranks", std::vector<int>(f.stopped_ranks().begin(), f.stopped_ranks().end())},
          {"fatal", f.fatal()},
          {"before_first_step", f.before_first_step()},
          {"time", Iso8601(f.time())}};
}

namespace {

nlohmann::json RankJson(const v1::RankStatus& rank) {
  nlohmann::json j = {{"rank", rank.rank()},
                      {"local_rank", rank.local_rank()},
                      {"node", rank.node()},
                      {"host", rank.host()},
                      {"pid", rank.pid()},
                      {"state", v1::RankStatus::State_Name(rank.state())},
                      {"step", rank.step()},
                      {"generation", rank.generation()},
                      {"last_heartbeat", Iso8601(rank.last_heartbeat())},
                      {"idle_seconds", static_cast<double>(rank.idle_ms()) / 1000.0}};
  if (rank.has_scheduler_task()) j["scheduler_task"] = rank.scheduler_task();
  if (rank.has_preflight()) {
    const v1::DevicePreflight& p = rank.preflight();
    j["preflight"] = {{"device", p.device()},
                      {"matmul_size", p.matmul_size()},
                      {"matmul_seconds", p.matmul_seconds()},
                      {"allreduce_seconds", p.allreduce_seconds()},
                      {"error", p.error()}};
  }
  return j;
}

// null without one.
nlohmann::json OrphanedJobJson(const v1::Run& r) {
  if (!r.has_orphaned_job()) return nullptr;
  const v1::OrphanedJob& o = r.orphaned_job();
  return {{"job", o.job()},
          {"action", o.cancel() ? "cancel" : "requeue"},
          {"batch_host", o.batch_host()},
          {"generation", o.generation()},
          {"nodes", std::vector<std::string>(o.nodes().begin(), o.nodes().end())},
          {"ranks", std::vector<int>(o.ranks().begin(), o.ranks().end())}};
}

}  // namespace

nlohmann::json RunJson(const v1::Run& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& rank : r.ranks()) ranks.push_back(RankJson(rank));
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : r.failures()) failures.push_back(FailureJson(f));
  nlohmann::json reason = nullptr;
  if (r.has_reason() && r.reason().kind() != v1::Failure::KIND_UNSPECIFIED) reason = FailureJson(r.reason());
  nlohmann::json barriers = nlohmann::json::array();
  for (const auto& b : r.open_barriers()) {
    barriers.push_back({{"name", b.name()},
                        {"sequence", b.sequence()},
                        {"arrived", b.arrived()},
                        {"missing_ranks", std::vector<int>(b.missing_ranks().begin(), b.missing_ranks().end())},
                        {"first_arrival", Iso8601(b.first_arrival())}});
  }
  nlohmann::json generations = nlohmann::json::array();
  for (const auto& s : r.generations()) {
    generations.push_back({{"generation", s.generation()},
                           {"nodes", s.nodes()},
                           {"world_size", s.world_size()},
                           {"lost_nodes", std::vector<std::string>(s.lost_nodes().begin(), s.lost_nodes().end())}});
  }
  std::string ended = Iso8601(r.ended_at());
  return {{"run_id", r.run_id()},
          {"name", r.spec().experiment_name()},
          {"state", StateName(r.state())},
          {"world_size", r.world_size()},
          {"nodes", r.spec().nodes()},
          {"procs_per_node", r.spec().procs_per_node()},
          {"procs_per_node_rule", r.spec().procs_per_node_rule()},
          {"procs_per_node_counted_on", r.procs_per_node_counted_on()},
          {"generation", r.generation()},
          {"restarts", r.restarts()},
          {"max_restarts", r.spec().max_restarts()},
          {"preemptions", r.preemptions()},
          {"max_requeues", r.spec().max_requeues()},
          {"excluded_nodes", std::vector<std::string>(r.excluded_nodes().begin(), r.excluded_nodes().end())},
          {"min_nodes", r.spec().min_nodes()},
          {"generation_nodes", std::vector<std::string>(r.generation_nodes().begin(), r.generation_nodes().end())},
          {"lost_nodes", std::vector<std::string>(r.lost_nodes().begin(), r.lost_nodes().end())},
          {"generations", generations},
          {"step", r.step()},
          {"total_steps", r.total_steps()},
          {"exp_dir", r.exp_dir()},
          {"latest_checkpoint_step",
           r.latest_checkpoint_step() >= 0 ? nlohmann::json(r.latest_checkpoint_step()) : nlohmann::json(nullptr)},
          {"resumed_from_step", r.resumed_from_step()},
          {"reason", reason},
          {"created_at", Iso8601(r.created_at())},
          {"ended_at", ended.empty() ? nlohmann::json(nullptr) : nlohmann::json(ended)},
          {"scheduler", v1::Scheduler_Name(r.spec().scheduler())},
          {"scheduler_job_id", r.scheduler_job_id()},
          {"batch_host", r.batch_host()},
          {"orphaned_job", OrphanedJobJson(r)},
          {"trainer_args", std::vector<std::string>(r.spec().trainer_args().begin(), r.spec().trainer_args().end())},
          {"ranks", ranks},
          {"failures", failures},
          {"open_barriers", barriers}};
}

nlohmann::json CheckpointJson(const v1::CheckpointInfo& c) {
  nlohmann::json out = {{"step", c.step()},       {"size", c.bytes()},           {"time", Iso8601(c.committed_at())},
                        {"path", c.path()},       {"committed", c.committed()},  {"generation", c.generation()},
                        {"sharded", c.sharded()}, {"world_size", c.world_size()}};
  if (c.sharded()) {
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& s : c.shards()) shards.push_back({{"rank", s.rank()}, {"files", s.files()}, {"size", s.bytes()}});
    out["shards"] = std::move(shards);
  } else {
    out["writer_rank"] = c.writer_rank();
  }
  return out;
}

std::string CheckpointWriters(const v1::CheckpointInfo& c) {
  if (!c.sharded()) return absl::StrCat("rank ", c.writer_rank());
  return absl::StrCat(c.shards_size(), " of ", c.world_size(), " ranks (sharded)");
}

nlohmann::json MetricJson(const v1::MetricRecord& m) {
  return {{"step", m.step()}, {"rank", m.rank()}, {"name", m.name()}, {"value", m.value()}, {"time", m.time()}};
}

}  // namespace dt
