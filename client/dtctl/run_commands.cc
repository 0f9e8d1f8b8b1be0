#include "client/dtctl/run_commands.h"

#include <sys/stat.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/checkpoint_manifest.h"
#include "client/dtctl/output.h"
#include "client/dtctl/slurm.h"
#include "client/slurm_job.h"
#include "common/fs.h"
#include "common/run_json.h"
#include "common/run_state.h"
#include "common/utf8.h"

namespace dt::ctl {
namespace {

std::string StepCell(const v1::Run& r) {
  return r.total_steps() > 0 ? absl::StrCat(r.step(), "/", r.total_steps()) : absl::StrCat(r.step());
}

// An elastic run's generations and their world sizes, the newest 8: "0: 6 ranks, 1: 4 ranks
// (without n3), 2: 6 ranks".
std::string GenerationsCell(const v1::Run& r) {
  std::vector<std::string> cells;
  int first = std::max(0, r.generations_size() - 8);
  for (int k = first; k < r.generations_size(); ++k) {
    const v1::GenerationShape& s = r.generations(k);
    cells.push_back(
        absl::StrCat(s.generation(), ": ", s.world_size(), " ranks",
                     s.lost_nodes_size() > 0
                         ? absl::StrCat(" (without ", PrintableForTerminal(absl::StrJoin(s.lost_nodes(), ", ")), ")")
                         : ""));
  }
  return absl::StrCat(first > 0 ? "..., " : "", absl::StrJoin(cells, ", "));
}

// "16 = 2 node(s) x 8", with how a counted --nproc-per-node came to its number.
std::string WorldCell(const v1::Run& r) {
  const v1::RunSpec& spec = r.spec();
  if (spec.procs_per_node() == 0) {
    return absl::StrCat("? = ", spec.nodes(), " node(s) x ? (--nproc-per-node ", spec.procs_per_node_rule(),
                        ": counted when the first node registers)");
  }
  int nodes = r.generation_nodes_size() > 0 ? r.generation_nodes_size() : spec.nodes();
  std::string out = absl::StrCat(r.world_size(), " = ", nodes, " node(s) x ", spec.procs_per_node());
  if (spec.min_nodes() > 0) {
    absl::StrAppend(&out, " (elastic: ", spec.min_nodes(), " to ", spec.nodes(), " nodes",
                    r.lost_nodes_size() > 0
                        ? absl::StrCat("; lost ", PrintableForTerminal(absl::StrJoin(r.lost_nodes(), ", ")))
                        : "",
                    ")");
  }
  if (!spec.procs_per_node_rule().empty()) {
    absl::StrAppend(&out, " (--nproc-per-node ", spec.procs_per_node_rule(), ", counted on ",
                    r.procs_per_node_counted_on().empty() ? "the submitting machine"
                                                          : PrintableForTerminal(r.procs_per_node_counted_on()),
                    ")");
  }
  return out;
}

// The status line of a job whose batch host is lost (Run.orphaned_job), with where the rank that
// claimed it names itself; empty without one.
std::string OrphanedJobLine(const v1::Run& r) {
  if (!r.has_orphaned_job()) return "";
  const v1::OrphanedJob& o = r.orphaned_job();
  return absl::StrCat("batch host ", PrintableForTerminal(o.batch_host()), " lost: a rank on ",
                      PrintableForTerminal(absl::StrJoin(o.nodes(), ", ")), o.cancel() ? " cancels" : " requeues",
                      " Slurm job ", PrintableForTerminal(o.job()),
                      " (the rank that claimed it: ", PrintableForTerminal(JoinPath(r.exp_dir(), "logs")),
                      "/slurm-job-", PrintableForTerminal(o.job()), "-restart-*-generation-", o.generation(), ")\n");
}

// ---- Commands -------------------------------------------------------------------------------

}  // namespace

int List(Global& g) {
  // Every page: one answer holds at most 4 MiB of runs (ListRuns' next_page_token).
  v1::ListRunsResponse all_runs;
  v1::ListRunsRequest req;
  do {
    auto page = Call(*g.client, &v1::RunService::Stub::ListRuns, g.client->runs(), req, absl::Seconds(30));
    if (!page.ok()) return Fail(g, page.status(), "list");
    for (auto& r : *page->mutable_runs()) *all_runs.add_runs() = std::move(r);
    req.set_page_token(page->next_page_token());
  } while (!req.page_token().empty());
  const v1::ListRunsResponse* runs = &all_runs;
  if (g.output == "json") {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& r : runs->runs()) all.push_back(RunJson(r));
    PrintJson(all);
    return kOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : runs->runs()) {
    rows.push_back({r.run_id(), r.spec().experiment_name(), StateName(r.state()), absl::StrCat(r.world_size()),
                    StepCell(r), absl::StrCat(r.restarts()), Ago(r.created_at()), r.exp_dir()});
  }
  std::cout << Table({"RUN", "NAME", "STATE", "WORLD", "STEP", "RESTARTS", "CREATED", "EXP DIR"}, rows);
  return kOk;
}

int Status(Global& g, const std::string& run_id) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), absl::StrCat("status of ", run_id));
  nlohmann::json j = RunJson(*r);
  std::optional<SlurmJob> job;
  if (r->spec().scheduler() == v1::SLURM && !r->scheduler_job_id().empty()) {
    absl::StatusOr<SlurmJob> q = QueryJob(r->scheduler_job_id());
    if (q.ok()) {
      job = *q;
      j["slurm"] = {{"job_id", q->id}, {"state", q->state}, {"reason", q->reason}, {"nodes", q->nodes}};
    } else {
      j["slurm"] = {{"job_id", r->scheduler_job_id()}, {"error", std::string(q.status().message())}};
    }
  }
  if (g.output == "json") {
    PrintJson(j);
    return kOk;
  }
  std::cout << "run        " << r->run_id() << " (" << r->spec().experiment_name() << ")\n"
            << "state      " << StateName(r->state()) << "  generation " << r->generation() << "  restarts "
            << r->restarts() << "/" << r->spec().max_restarts()
            << (r->preemptions() > 0 || r->spec().max_requeues() > 0
                    ? absl::StrCat("  requeues ", r->preemptions(), "/", r->spec().max_requeues())
                    : "")
            << "\n"
            << "world      " << WorldCell(*r) << "  (" << v1::Scheduler_Name(r->spec().scheduler())
            << (r->scheduler_job_id().empty() ? "" : absl::StrCat(" ", PrintableForTerminal(r->scheduler_job_id())))
            << (r->batch_host().empty() ? ""
                                        : absl::StrCat(", batch script on ", PrintableForTerminal(r->batch_host())))
            << ")\n"
            << "step       " << StepCell(*r) << "\n"
            << "checkpoint "
            << (r->latest_checkpoint_step() >= 0 ? absl::StrCat("step ", r->latest_checkpoint_step()) : "none")
            << (r->resumed_from_step() > 0 ? absl::StrCat("  (resumed from step ", r->resumed_from_step(), ")") : "")
            << "\n"
            << OrphanedJobLine(*r) << "exp dir    " << r->exp_dir() << "\n"
            << "created    " << Iso8601(r->created_at())
            << (r->has_ended_at() ? absl::StrCat("   ended ", Iso8601(r->ended_at())) : "") << "\n";
  if (job)
    std::cout << "slurm      job " << job->id << " " << job->state << " (" << job->reason << ") " << job->nodes << "\n";
  if (r->generations_size() > 1) std::cout << "generations " << GenerationsCell(*r) << "\n";
  if (r->excluded_nodes_size() > 0) {
    std::cout << "excluded   " << PrintableForTerminal(absl::StrJoin(r->excluded_nodes(), ", "))
              << " (failed or unhealthy under this run)\n";
  }
  if (r->has_reason() && r->reason().kind() != v1::Failure::KIND_UNSPECIFIED) {
    std::cout << "reason     " << FailureLine(r->reason()) << "\n";
    if (r->reason().has_verdict()) std::cout << VerdictLines(r->reason().verdict());
  }
  for (const v1::OpenBarrier& b : r->open_barriers()) {
    std::vector<std::string> missing;
    for (int rank : b.missing_ranks()) missing.push_back(absl::StrCat(rank));
    int missing_count = r->world_size() - b.arrived();
    std::cout << "barrier    " << PrintableForTerminal(b.name()) << " (instance " << b.sequence()
              << "): " << b.arrived() << " of " << r->world_size() << " arrived, the first " << Ago(b.first_arrival())
              << "; waiting for rank" << (missing_count == 1 ? " " : "s ") << absl::StrJoin(missing, ", ")
              << (missing_count > b.missing_ranks_size() ? ", ..." : "") << "\n";
  }
  if (r->ranks_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& rank : r->ranks()) {
      rows.push_back({rank.rank() >= 0 ? absl::StrCat(rank.rank()) : "-", absl::StrCat(rank.local_rank()), rank.node(),
                      rank.host(), absl::StrCat(rank.pid()), v1::RankStatus::State_Name(rank.state()),
                      absl::StrCat(rank.step()), Ago(rank.last_heartbeat()), PreflightCell(rank)});
    }
    std::cout << "\n"
              << Table({"RANK", "LOCAL", "NODE", "HOST", "PID", "STATE", "STEP", "HEARTBEAT", "PREFLIGHT"}, rows);
  }
  return kOk;
}

int Logs(Global& g, const std::string& run_id, std::optional<int> rank, LogsQuery query) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), absl::StrCat("logs of ", run_id));
  query.logs_dir = JoinPath(r->exp_dir(), "logs");
  const int ranks = MostRanks(*r);  // an elastic run's lost ranks keep their logs
  if (rank) {
    if (*rank < 0 || *rank >= std::max(1, ranks)) {
      std::cerr << "dtctl logs: rank " << *rank << " is outside 0.." << ranks - 1 << "\n";
      return kUsage;
    }
    query.ranks.push_back(*rank);
  } else {
    for (int i = 0; i < ranks; ++i) query.ranks.push_back(i);
  }
  auto run_ended = [&] {
    absl::StatusOr<v1::Run> now = GetRun(g, run_id);
    return now.ok() && IsTerminal(now->state());
  };
  absl::Status printed = PrintLogs(query, run_ended, std::cout);
  if (!printed.ok()) {
    std::cerr << "dtctl logs: " << printed.message() << "\n";
    return printed.code() == absl::StatusCode::kInvalidArgument ? kUsage : kFailed;
  }
  return kOk;
}

int Metrics(Global& g, const std::string& run_id, const std::string& key, std::optional<int> rank) {
  v1::QueryMetricsRequest req;
  req.set_run_id(run_id);
  req.set_name(key);
  if (rank) req.set_rank(*rank);
  absl::StatusOr<std::vector<v1::MetricRecord>> records = QueryAllMetrics(*g.client, req, absl::Seconds(60));
  if (!records.ok()) return Fail(g, records.status(), absl::StrCat("metrics of ", run_id));
  if (g.output == "json") {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& rec : *records) all.push_back(MetricJson(rec));
    PrintJson(all);
  } else if (g.output == "csv") {
    std::cout << "step,rank,name,value,time\n";
    for (const auto& rec : *records) {
      std::cout << absl::StrFormat("%d,%d,%s,%.17g,%.6f\n", rec.step(), rec.rank(), rec.name(), rec.value(),
                                   rec.time());
    }
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const auto& rec : *records) {
      rows.push_back(
          {absl::StrCat(rec.step()), absl::StrCat(rec.rank()), rec.name(), absl::StrFormat("%.6g", rec.value())});
    }
    std::cout << Table({"STEP", "RANK", "NAME", "VALUE"}, rows);
  }
  return kOk;
}

// With `verify`, every committed checkpoint's files are read again here and checked against the
// sizes and SHA-256 digests its writer recorded (exit 1 if one differs).
int Checkpoints(Global& g, const std::string& run_id, bool verify) {
  v1::ListCheckpointsRequest req;
  req.set_run_id(run_id);
  auto list =
      Call(*g.client, &v1::CheckpointService::Stub::ListCheckpoints, g.client->checkpoints(), req, absl::Seconds(30));
  if (!list.ok()) return Fail(g, list.status(), absl::StrCat("checkpoints of ", run_id));
  std::vector<std::string> verdicts;
  bool corrupt = false;
  for (const auto& c : list->checkpoints()) {
    if (!verify || !c.committed()) {
      verdicts.push_back("");
      continue;
    }
    struct stat st;
    if (::stat(c.path().c_str(), &st) != 0) {
      verdicts.push_back("gone (removed by retention since it was listed)");
      continue;
    }
    absl::StatusOr<int64_t> checked = VerifyCheckpointDirectory(c.path());
    corrupt = corrupt || !checked.ok();
    verdicts.push_back(checked.ok() ? "ok" : PrintableForTerminal(checked.status().message()));
  }
  if (g.output == "json") {
    nlohmann::json all = nlohmann::json::array();
    for (int i = 0; i < list->checkpoints_size(); ++i) {
      all.push_back(CheckpointJson(list->checkpoints(i)));
      if (verify && list->checkpoints(i).committed()) all.back()["verified"] = verdicts[i];
    }
    PrintJson(all);
  } else {
    std::vector<std::vector<std::string>> rows;
    for (int i = 0; i < list->checkpoints_size(); ++i) {
      const v1::CheckpointInfo& c = list->checkpoints(i);
      rows.push_back({absl::StrCat(c.step()), HumanBytes(c.bytes()), Iso8601(c.committed_at()), c.path(),
                      c.committed() ? "yes" : "no", CheckpointWriters(c)});
      if (verify) rows.back().push_back(verdicts[i]);
    }
    std::vector<std::string> header = {"STEP", "SIZE", "TIME", "PATH", "COMMITTED", "WRITTEN BY"};
    if (verify) header.push_back("VERIFIED");
    std::cout << Table(header, rows);
  }
  if (corrupt) {
    std::cerr << "dtctl: a checkpoint of " << run_id
              << " does not match what its writer recorded: do not resume from it (delete it, and `latest` "
                 "if it names it, to resume from an earlier one)\n";
    return kFailed;
  }
  return kOk;
}

int Stacks(Global& g, const StacksQuery& q) {
  absl::StatusOr<std::vector<v1::StackCapture>> captures = FetchStacks(*g.client, q);
  if (!captures.ok()) return Fail(g, captures.status(), absl::StrCat("stacks of ", q.run_id));
  if (g.output == "json") {
    PrintJson(CapturesJson(*captures, q.rank));
    return kOk;
  }
  if (captures->empty()) {
    std::cout << "run " << q.run_id << " has no stored stack captures"
              << (q.generation ? absl::StrCat(" of generation ", *q.generation) : "")
              << " (one is taken when a hang ends a generation, or by dtctl stacks while the run trains)\n";
    return kOk;
  }
  std::cout << FormatCaptures(*captures, q.rank);
  return kOk;
}

int Cancel(Global& g, const std::string& run_id) {
  auto before = GetRun(g, run_id);
  if (!before.ok()) return Fail(g, before.status(), absl::StrCat("cancel ", run_id));
  v1::CancelRunRequest req;
  req.set_run_id(run_id);
  req.set_reason(absl::StrCat("cancelled with dtctl by ", std::getenv("USER") ? std::getenv("USER") : "a user"));
  auto r = Call(*g.client, &v1::RunService::Stub::CancelRun, g.client->runs(), req, absl::Seconds(30));
  if (!r.ok()) return Fail(g, r.status(), absl::StrCat("cancel ", run_id));
  // Slurm: take the allocation away too. Local: the launcher sees CANCELLED and stops its trainers.
  if (r->spec().scheduler() == v1::SLURM && !r->scheduler_job_id().empty()) {
    if (absl::Status s = CancelSlurmJob(r->scheduler_job_id()); !s.ok()) {
      std::cerr << "dtctl: the run is cancelled but scancel failed: " << s.message() << "\n";
    }
  }
  if (g.output == "json") {
    PrintJson({{"run_id", run_id}, {"state", StateName(r->state())}, {"was", StateName(before->state())}});
  } else if (IsTerminal(before->state())) {
    std::cout << run_id << " had already ended " << StateName(before->state()) << "\n";
  } else {
    std::cout << run_id << " " << StateName(r->state()) << "\n";
  }
  return kOk;
}

}  // namespace dt::ctl
