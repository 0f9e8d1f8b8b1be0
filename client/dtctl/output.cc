#include "client/dtctl/output.h"

#include "common/run_state.h"
#include "common/utf8.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dt::ctl {

std::string StateName(v1::RunState state) { return v1::RunState_Name(state); }

std::string Iso8601(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "";
  absl::Time at = absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", at, absl::UTCTimeZone());
}

std::string HumanSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string Ago(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "";
  double secs = absl::ToDoubleSeconds(absl::Now() - absl::FromUnixSeconds(t.seconds()));
  return absl::StrCat(HumanSeconds(std::max(0.0, secs)), " ago");
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string FailureLine(const v1::Failure& f) {
  // The message and type come from the run's processes: escaped, they cannot drive the terminal.
  return PrintableForTerminal(DescribeFailure(f));
}

nlohmann::json FailureJson(const v1::Failure& f) {
  return {{"kind", v1::Failure::Kind_Name(f.kind())},
          {"rank", f.rank()},
          {"host", f.host()},
          {"node", f.node()},
          {"generation", f.generation()},
          {"step", f.step()},
          {"message", f.message()},
          {"exception_type", f.exception_type()},
          {"stopped_ranks", std::vector<int>(f.stopped_ranks().begin(), f.stopped_ranks().end())},
          {"fatal", f.fatal()},
          {"time", Iso8601(f.time())}};
}

nlohmann::json RunJson(const v1::Run& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& rank : r.ranks()) {
    ranks.push_back({{"rank", rank.rank()},
                     {"local_rank", rank.local_rank()},
                     {"node", rank.node()},
                     {"host", rank.host()},
                     {"pid", rank.pid()},
                     {"state", v1::RankStatus::State_Name(rank.state())},
                     {"step", rank.step()},
                     {"generation", rank.generation()},
                     {"last_heartbeat", Iso8601(rank.last_heartbeat())}});
    if (rank.has_scheduler_task()) ranks.back()["scheduler_task"] = rank.scheduler_task();
    if (rank.has_preflight()) {
      const v1::DevicePreflight& p = rank.preflight();
      ranks.back()["preflight"] = {{"device", p.device()},
                                   {"matmul_size", p.matmul_size()},
                                   {"matmul_seconds", p.matmul_seconds()},
                                   {"allreduce_seconds", p.allreduce_seconds()},
                                   {"error", p.error()}};
    }
  }
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : r.failures()) failures.push_back(FailureJson(f));
  nlohmann::json reason = nullptr;
  if (r.has_reason() && r.reason().kind() != v1::Failure::KIND_UNSPECIFIED) {
    reason = FailureJson(r.reason());
    reason["summary"] = DescribeFailure(r.reason());
  }
  std::string ended = Iso8601(r.ended_at());
  return {{"run_id", r.run_id()},
          {"name", r.spec().experiment_name()},
          {"state", StateName(r.state())},
          {"world_size", r.world_size()},
          {"nodes", r.spec().nodes()},
          {"procs_per_node", r.spec().procs_per_node()},
          {"generation", r.generation()},
          {"restarts", r.restarts()},
          {"max_restarts", r.spec().max_restarts()},
          {"preemptions", r.preemptions()},
          {"max_requeues", r.spec().max_requeues()},
          {"excluded_nodes", std::vector<std::string>(r.excluded_nodes().begin(), r.excluded_nodes().end())},
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
          {"trainer_args", std::vector<std::string>(r.spec().trainer_args().begin(), r.spec().trainer_args().end())},
          {"ranks", ranks},
          {"failures", failures}};
}

std::string PreflightCell(const v1::RankStatus& rank) {
  if (!rank.has_preflight()) return "";
  const v1::DevicePreflight& p = rank.preflight();
  if (!p.error().empty()) return "device error";
  return absl::StrFormat("%.1f ms", p.matmul_seconds() * 1e3);
}

nlohmann::json CheckpointJson(const v1::CheckpointInfo& c) {
  return {{"step", c.step()}, {"size", c.bytes()},          {"time", Iso8601(c.committed_at())},
          {"path", c.path()}, {"committed", c.committed()}, {"generation", c.generation()}};
}

nlohmann::json MetricJson(const v1::MetricRecord& m) {
  return {{"step", m.step()}, {"rank", m.rank()}, {"name", m.name()}, {"value", m.value()}, {"time", m.time()}};
}

std::string Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      out += cells[i];
      if (i + 1 < cells.size()) out += std::string(width[i] - cells[i].size() + 2, ' ');
    }
    out += '\n';
  };
  line(header);
  for (const auto& row : rows) line(row);
  return out;
}

}  // namespace dt::ctl
