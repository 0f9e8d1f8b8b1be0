// dtctl: the dt command line. Exit codes: 0 ok, 1 the operation failed (the message says why),
// 2 usage error, 3 the coordinator cannot be reached.
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/algorithm/container.h"
#include "absl/synchronization/mutex.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/checkpoint_manifest.h"
#include "client/coordinator_client.h"
#include "client/dtctl/local_launcher.h"
#include "client/dtctl/logs.h"
#include "client/dtctl/node_failure.h"
#include "client/dtctl/output.h"
#include "client/dtctl/slurm.h"
#include "client/dtctl/srun_report.h"
#include "client/dtctl/stacks.h"
#include "client/dtctl/submit.h"
#include "client/dtctl/watch.h"
#include "common/cli_checks.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/limits.h"
#include "common/procs_per_node.h"
#include "common/run_env.h"
#include "common/run_state.h"
#include "common/subprocess.h"
#include "common/utf8.h"
#include "common/version.h"

namespace dt::ctl {
namespace {

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;
constexpr int kUnreachable = 3;
constexpr int kJobRequeued = 5;  // exclude-failed-nodes requeued the job: the batch script ends

struct Global {
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  std::string output = "table";
  std::shared_ptr<CoordinatorClient> client;
};

int Fail(const Global& g, const absl::Status& s, const std::string& what) {
  // A coordinator's message may quote what a run sent (a failure's text): never raw to a terminal.
  std::string message = PrintableForTerminal(s.message());
  if (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded) {
    std::cerr << "dtctl: cannot reach the coordinator at " << g.coordinator << " (" << message
              << "); is dtcoord running? set --coordinator or DT_COORDINATOR\n";
    return kUnreachable;
  }
  if (s.code() == absl::StatusCode::kUnauthenticated || s.code() == absl::StatusCode::kPermissionDenied) {
    std::cerr << "dtctl: " << what << ": " << message
              << " (pass --token-file, or set DT_TOKEN to the coordinator's admin token)\n";
    return kFailed;
  }
  std::cerr << "dtctl: " << what << ": " << message << "\n";
  return kFailed;
}

int Connect(Global& g) {
  std::string default_file;
  if (const char* home = std::getenv("HOME"); home != nullptr) default_file = JoinPath(home, ".dt/coord/admin.token");
  absl::StatusOr<std::string> token =
      g.token_file.empty() ? ResolveToken("", "DT_TOKEN", default_file) : ResolveToken("", nullptr, g.token_file);
  if (!token.ok()) {
    std::cerr << "dtctl: " << token.status().message() << "\n";
    return kUsage;
  }
  absl::StatusOr<std::shared_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect(g.coordinator, *token, g.tls_ca);
  if (!client.ok()) {
    std::cerr << "dtctl: " << client.status().message() << "\n";
    return kUsage;
  }
  if (absl::Status s = (*client)->WaitConnected(absl::Seconds(5)); !s.ok()) {
    std::cerr << "dtctl: " << s.message() << "\n";
    return kUnreachable;
  }
  g.client = *client;
  return kOk;
}

absl::StatusOr<v1::Run> GetRun(Global& g, const std::string& run_id) {
  v1::GetRunRequest req;
  req.set_run_id(run_id);
  return Call(*g.client, &v1::RunService::Stub::GetRun, g.client->runs(), req, absl::Seconds(30));
}

void PrintJson(const nlohmann::json& j) { std::cout << j.dump(2) << "\n"; }

std::string StepCell(const v1::Run& r) {
  return r.total_steps() > 0 ? absl::StrCat(r.step(), "/", r.total_steps()) : absl::StrCat(r.step());
}

// "16 = 2 node(s) x 8", with how a counted --nproc-per-node came to its number.
std::string WorldCell(const v1::Run& r) {
  const v1::RunSpec& spec = r.spec();
  if (spec.procs_per_node() == 0) {
    return absl::StrCat("? = ", spec.nodes(), " node(s) x ? (--nproc-per-node ", spec.procs_per_node_rule(),
                        ": counted when the first node registers)");
  }
  std::string out = absl::StrCat(r.world_size(), " = ", spec.nodes(), " node(s) x ", spec.procs_per_node());
  if (!spec.procs_per_node_rule().empty()) {
    absl::StrAppend(&out, " (--nproc-per-node ", spec.procs_per_node_rule(), ", counted on ",
                    r.procs_per_node_counted_on().empty() ? "the submitting machine"
                                                          : PrintableForTerminal(r.procs_per_node_counted_on()),
                    ")");
  }
  return out;
}

// ---- Commands -------------------------------------------------------------------------------

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
            << ")\n"
            << "step       " << StepCell(*r) << "\n"
            << "checkpoint "
            << (r->latest_checkpoint_step() >= 0 ? absl::StrCat("step ", r->latest_checkpoint_step()) : "none")
            << (r->resumed_from_step() > 0 ? absl::StrCat("  (resumed from step ", r->resumed_from_step(), ")") : "")
            << "\n"
            << "exp dir    " << r->exp_dir() << "\n"
            << "created    " << Iso8601(r->created_at())
            << (r->has_ended_at() ? absl::StrCat("   ended ", Iso8601(r->ended_at())) : "") << "\n";
  if (job)
    std::cout << "slurm      job " << job->id << " " << job->state << " (" << job->reason << ") " << job->nodes << "\n";
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
  if (rank) {
    if (*rank < 0 || *rank >= std::max(1, r->world_size())) {
      std::cerr << "dtctl logs: rank " << *rank << " is outside 0.." << r->world_size() - 1 << "\n";
      return kUsage;
    }
    query.ranks.push_back(*rank);
  } else {
    for (int i = 0; i < r->world_size(); ++i) query.ranks.push_back(i);
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
                      c.committed() ? "yes" : "no"});
      if (verify) rows.back().push_back(verdicts[i]);
    }
    std::vector<std::string> header = {"STEP", "SIZE", "TIME", "PATH", "COMMITTED"};
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
    if (absl::Status s = CancelJob(r->scheduler_job_id()); !s.ok()) {
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

// Used by the sbatch script before each srun step: 0, printing the generation the step's trainers
// will join, when the coordinator wants one (first launch or a restart); 1 once the run ended.
int AwaitRestart(Global& g, const std::string& run_id) {
  absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (absl::Now() < deadline) {
    auto r = GetRun(g, run_id);
    if (r.ok()) {
      if (IsTerminal(r->state())) return kFailed;
      if (r->state() == v1::RESTARTING || r->state() == v1::RENDEZVOUS || r->state() == v1::PENDING ||
          r->state() == v1::REQUEUED) {
        std::cout << r->generation() << "\n";
        return kOk;
      }
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
  return kFailed;
}

// Used by the sbatch script after each srun step: 0 when every rank checkpointed and left because
// the scheduler asked the job to stop (the run is REQUEUED: the script requeues the job), else 1.
int RequeueWanted(Global& g, const std::string& run_id) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), "requeue-wanted");
  return r->state() == v1::REQUEUED ? kOk : kFailed;
}

// Used by the batch script of a job Slurm requeued (a node failure ends a --requeue job NODE_FAIL
// and puts it back in the queue) and before each next generation: the nodes the run's ranks last
// ran on that Slurm shows failed are recorded with the coordinator (the run's excluded nodes, each
// with a NODE_FAILED record) and kept off the job; when this allocation holds an excluded node — a
// failed node back in service, or one the coordinator found unhealthy (NODE_UNHEALTHY) — the job
// is requeued without it and the script ends (exit 5).
int ExcludeFailedNodes(Global& g, const std::string& run_id, const std::string& job_id, const std::string& allocation) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), "exclude-failed-nodes");
  v1::ExcludeNodesRequest request;
  request.set_run_id(run_id);
  for (const auto& [node, last_heard] : SuspectNodes(*r)) {
    absl::StatusOr<std::string> line = DescribeNode(node);
    if (!line.ok()) {
      std::cerr << "dtctl exclude-failed-nodes: cannot ask Slurm about node " << node << ": " << line.status().message()
                << "\n";
      continue;
    }
    if (std::optional<std::string> evidence = NodeFailureEvidence(ParseSlurmNode(*line), last_heard)) {
      v1::FailedNode* f = request.add_nodes();
      f->set_node(node);
      f->set_evidence(*evidence);
    }
  }
  std::vector<std::string> excluded(r->excluded_nodes().begin(), r->excluded_nodes().end());
  if (request.nodes_size() > 0) {
    auto reply = Call(*g.client, &v1::RunService::Stub::ExcludeNodes, g.client->runs(), request, absl::Seconds(30));
    if (!reply.ok()) return Fail(g, reply.status(), "exclude-failed-nodes");
    excluded.assign(reply->excluded_nodes().begin(), reply->excluded_nodes().end());
    for (const v1::FailedNode& n : request.nodes()) {
      std::cout << "dt: node " << n.node() << " failed (" << n.evidence() << "): excluded from job " << job_id << "\n";
    }
    std::cout.flush();
  }
  if (excluded.empty()) return kOk;
  absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(allocation);
  if (!nodes.ok()) return Fail(g, nodes.status(), "exclude-failed-nodes");
  bool holds_excluded =
      absl::c_any_of(*nodes, [&](const std::string& n) { return absl::c_linear_search(excluded, n); });
  // Slurm changes ExcNodeList only while a job is pending: a later requeue of this job (a
  // preemption) that lands on an excluded node comes back through here.
  if (!holds_excluded) return kOk;
  // Requeue, then exclude while the job waits for its old credentials to expire. The requeue
  // sends this script SIGTERM (SIGKILL after KillWait): ignored until the exclusion is made.
  std::signal(SIGTERM, SIG_IGN);
  if (absl::Status s = RequeueJob(job_id); !s.ok()) return Fail(g, s, "exclude-failed-nodes");
  if (absl::Status s = ExcludeNodesFromJob(job_id, excluded); !s.ok()) return Fail(g, s, "exclude-failed-nodes");
  std::cout << "dt: job " << job_id << " was given excluded node(s) in " << allocation << "; requeued without "
            << absl::StrJoin(excluded, ",") << std::endl;
  return kJobRequeued;
}

// Used by the batch script before it launches the next generation. When the last one failed
// because a rank on a node of this allocation went silent, the node may be dead: Slurm is given
// its SlurmdTimeout to tell. A dead node is marked NOT_RESPONDING, then DOWN, and the job ends
// NODE_FAIL — requeued, this script with it — so while Slurm shows it so, this waits; a node with
// no mark by then is alive, and the step is launched again (launching onto a dead node would
// spend the run's restarts on steps that cannot start).
int AwaitSilentNode(Global& g, const std::string& run_id, const std::string& allocation) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), "await-silent-node");
  if (!r->has_reason() || r->reason().kind() != v1::Failure::HEARTBEAT_TIMEOUT) return kOk;
  const std::string node = r->reason().node();
  absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(allocation);
  if (!nodes.ok()) return Fail(g, nodes.status(), "await-silent-node");
  if (!absl::c_linear_search(*nodes, node)) return kOk;
  absl::Duration patience = SlurmdTimeout().value_or(absl::Minutes(5)) + absl::Seconds(30);
  absl::Time start = absl::Now();
  absl::Time deadline = start + patience;
  std::cout << "dt: a rank on node " << node << " went silent; giving Slurm up to " << absl::FormatDuration(patience)
            << " to say whether the node is dead" << std::endl;
  bool reported = false;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> line = DescribeNode(node);
    SlurmNode n = line.ok() ? ParseSlurmNode(*line) : SlurmNode{};
    bool dead = absl::StrContains(n.state, "NOT_RESPONDING") || absl::StrContains(n.state, "DOWN") ||
                absl::StrContains(n.state, "FAIL");
    if (dead) {
      if (!reported) {
        std::cout << "dt: Slurm reports node " << node << " " << n.state
                  << ": waiting for it to end the job (NODE_FAIL), which requeues it without the node" << std::endl;
        reported = true;
      }
      // Slurm ends the job once it marks the node DOWN; bounded in case it never does.
      deadline = std::max(deadline, std::min(absl::Now() + patience, start + 3 * patience));
    }
    absl::SleepFor(absl::Seconds(2));
  }
  std::cout << "dt: node " << node << (reported ? " is still allocated: " : " answers Slurm: ")
            << "launching the next generation" << std::endl;
  return kOk;
}

// Used by the sbatch script after an srun step ended badly: sends srun's account of the first task
// that failed (or srun's own error) to the coordinator as the generation's root cause.
int ReportStep(Global& g, const std::string& run_id, int64_t generation, int exit_code, const std::string& srun_log) {
  absl::StatusOr<std::string> text = ReadFile(srun_log);
  if (!text.ok()) std::cerr << "dtctl report-step: " << text.status().message() << " (reporting the exit code only)\n";
  std::optional<v1::ReportErrorRequest> report =
      StepFailureReport(run_id, generation, exit_code, text.ok() ? *text : "", NodeName());
  if (!report) return kOk;
  auto reply =
      Call(*g.client, &v1::RendezvousService::Stub::ReportError, g.client->rendezvous(), *report, absl::Seconds(30));
  if (reply.ok()) {
    std::cout << "dt: reported to the coordinator: " << PrintableForTerminal(report->message()) << "\n";
    return kOk;
  }
  if (reply.status().code() == absl::StatusCode::kAborted) {
    // The coordinator had already found the cause (a trainer's report, a heartbeat timeout).
    std::cout << "dt: " << PrintableForTerminal(reply.status().message()) << "\n";
    return kOk;
  }
  return Fail(g, reply.status(), "report-step");
}

// `dtctl submit`'s flags, each declared once: what it sets, and — when given on the command line —
// that it overrides the run file.
class SubmitFlags {
 public:
  explicit SubmitFlags(CLI::App* submit) : submit_(submit) {}

  template <typename T>
  CLI::Option* Add(const std::string& name, T SubmitOptions::*field, const std::string& help) {
    CLI::Option* option = submit_->add_option(name, flags_.*field, help);
    overrides_.emplace_back(option, [this, field](SubmitOptions& merged) { merged.*field = flags_.*field; });
    return option;
  }
  // --nproc-per-node: a count, or gpu|cpu|auto counted where the ranks run (SubmitOptions::nproc_rule).
  void AddProcsPerNode() {
    CLI::Option* option =
        submit_
            ->add_option("--nproc-per-node", procs_text_,
                         "processes per node: a count (one per GPU), or as torchrun: gpu (one per visible GPU), cpu "
                         "(one per usable CPU), auto (gpu where the node has GPUs, else cpu), counted on each node")
            ->check(CLI::Validator(
                [](std::string& text) {
                  absl::StatusOr<dt::ProcsPerNode> parsed = dt::ParseProcsPerNode(text);
                  return parsed.ok() ? std::string() : std::string(parsed.status().message());
                },
                "COUNT|gpu|cpu|auto"));
    overrides_.emplace_back(option, [this](SubmitOptions& merged) {
      dt::ProcsPerNode parsed = *dt::ParseProcsPerNode(procs_text_);  // the validator accepted it
      merged.nproc_per_node = parsed.count;
      merged.nproc_rule = parsed.rule;
    });
  }
  // The run file's options (or the defaults) with every flag the command line gave on top.
  void ApplyGiven(SubmitOptions& merged) const {
    for (const auto& [option, apply] : overrides_) {
      if (option->count() > 0) apply(merged);
    }
  }
  const SubmitOptions& flags() const { return flags_; }

 private:
  CLI::App* submit_;
  SubmitOptions flags_;
  std::string procs_text_;
  std::vector<std::pair<CLI::Option*, std::function<void(SubmitOptions&)>>> overrides_;
};

struct SubmitCli {
  CLI::App* command = nullptr;
  std::unique_ptr<SubmitFlags> flags;
  std::vector<std::string> words;  // after --: trainer arguments, or with --exec the command
  std::string run_file;
  std::vector<std::string> env;  // --env KEY=VALUE, in order
  std::string env_file;
  bool follow = false;
  bool dry_run = false;
  bool exec = false;
};

void DeclareSubmit(CLI::App& app, SubmitCli& cli) {
  cli.command = app.add_subcommand(
      "submit", "submit a run: dtctl submit --name N --save-dir D [...] -- TRAINER_ARGS, or [...] --exec -- CMD ARGS");
  cli.flags = std::make_unique<SubmitFlags>(cli.command);
  SubmitFlags& f = *cli.flags;
  f.Add("--name", &SubmitOptions::name, "experiment name (the directory under --save-dir)");
  f.Add("--save-dir", &SubmitOptions::save_dir, "where experiment directories go");
  f.Add("--nodes", &SubmitOptions::nodes, "nodes")->check(dt::InRange(1, dt::kMaxWorldSize));
  f.AddProcsPerNode();
  f.Add("--scheduler", &SubmitOptions::scheduler, "local or slurm")->check(CLI::IsMember({"local", "slurm"}));
  f.Add("--log-strategy", &SubmitOptions::log_strategy, "W&B: main, node or all")
      ->check(CLI::IsMember({"main", "node", "all"}));
  f.Add("--wandb-project", &SubmitOptions::wandb_project, "W&B project (the coordinator holds the API key)");
  f.Add("--wandb-entity", &SubmitOptions::wandb_entity, "W&B entity");
  f.Add("--wandb-mode", &SubmitOptions::wandb_mode, "online, offline or disabled")
      ->check(CLI::IsMember({"online", "offline", "disabled"}));
  f.Add("--max-restarts", &SubmitOptions::max_restarts, "restarts of the whole group the run may use")
      ->check(dt::InRange(0, 1000));
  f.Add("--keep-checkpoints", &SubmitOptions::keep_checkpoints, "committed checkpoints to keep")
      ->check(dt::InRange(1, 1000));
  f.Add("--max-requeues", &SubmitOptions::max_requeues,
        "Slurm: requeues after a preemption or the time limit the run may use (apart from --max-restarts)")
      ->check(dt::InRange(0, 1000));
  f.Add("--preempt-grace", &SubmitOptions::preempt_grace_s,
        "Slurm: seconds before a preemption or the time limit at which Slurm sends SIGUSR2 "
        "(#SBATCH --signal=USR2@N): the trainers checkpoint at a step they agree on and the job is "
        "requeued. Must cover a checkpoint round of your model (default 120 s: GPT-2 124M with AdamW "
        "is ~1.5 GB; raise it for larger models or slow file systems)")
      ->check(dt::InRange(10, 86400));
  f.Add("--gpus-per-node", &SubmitOptions::gpus_per_node, "Slurm: request --gres=gpu:N")->check(dt::InRange(0, 1024));
  f.Add("--omp-threads", &SubmitOptions::omp_threads, "OMP_NUM_THREADS per trainer (local default: cores / trainers)")
      ->check(dt::InRange(1, 1024));
  f.Add("--sbatch-arg", &SubmitOptions::sbatch_args,
        "extra #SBATCH option, e.g. --sbatch-arg=--partition=gpu (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  f.Add("--trainer", &SubmitOptions::trainer, "dttrainer binary (default: the one beside dtctl)");
  f.Add("--idle-timeout", &SubmitOptions::idle_timeout,
        "--exec runs: a rank whose processes neither print, nor use CPU, nor report a step for this long is hung: "
        "its stacks are captured and the group restarts (default 20m: shorter than torch's 30-minute collective "
        "timeout; 0 turns it off)");
  f.Add("--max-identical-hangs", &SubmitOptions::max_identical_hangs,
        "a hang whose odd stack repeats this many generations in a row ends the run (HUNG_REPEATEDLY; default 1)")
      ->check(dt::InRange(1, 1000));
  cli.command->add_option("-f,--file", cli.run_file, "YAML run file; flags override it");
  cli.command
      ->add_option("--env", cli.env,
                   "KEY=VALUE for every rank (repeatable; over --env-file and the run file's env:); dt's own "
                   "names (RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, DT_*, ...) are refused")
      ->expected(1)  // one KEY=VALUE each time: the words after -- are never taken
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli.command->add_option("--env-file", cli.env_file,
                          "a file of KEY=VALUE lines for every rank ('#' comments; values taken as written)");
  cli.command->add_flag("--follow", cli.follow, "watch the run until it ends (exit code as watch)");
  cli.command->add_flag("--dry-run", cli.dry_run,
                        "check and print what would be launched (sbatch script or trainer commands); submit nothing");
  cli.command->add_flag("--exec", cli.exec,
                        "run your own program instead of dttrainer: the words after -- are the command, started once "
                        "per rank by dtrun with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), in this "
                        "directory");
  cli.command->add_option("trainer_args", cli.words, "arguments for dttrainer (or, with --exec, the command), after --")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

// A `dtctl submit` flag that dttrainer does not take, among the words after -- (a --dry-run there
// would launch the run instead of printing it).
std::optional<std::string> DtctlFlagAmong(const std::vector<std::string>& words) {
  static const char* const kSubmitOnly[] = {"--dry-run",
                                            "--exec",
                                            "--follow",
                                            "--gpus-per-node",
                                            "--keep-checkpoints",
                                            "--log-strategy",
                                            "--max-requeues",
                                            "--name",
                                            "--nodes",
                                            "--omp-threads",
                                            "--preempt-grace",
                                            "--sbatch-arg",
                                            "--scheduler",
                                            "--trainer",
                                            "--wandb-entity",
                                            "--wandb-mode",
                                            "--wandb-project",
                                            "-f",
                                            "--file",
                                            "--idle-timeout",
                                            "--max-identical-hangs",
                                            "--env",
                                            "--env-file"};
  for (const std::string& w : words) {
    std::string flag = w.substr(0, w.find('='));
    for (const char* f : kSubmitOnly) {
      if (flag == f) return flag;
    }
  }
  return std::nullopt;
}

// The run file, then the flags given, then the words after --; paths made absolute.
absl::StatusOr<SubmitOptions> SubmitOptionsOf(const SubmitCli& cli) {
  SubmitOptions merged;
  if (!cli.run_file.empty()) {
    if (absl::Status s = LoadRunFile(cli.run_file, &merged); !s.ok()) return s;
  }
  cli.flags->ApplyGiven(merged);
  if (!cli.env_file.empty()) {
    absl::StatusOr<std::string> text = dt::ReadFile(cli.env_file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--env-file ", cli.env_file, " cannot be read: ", text.status().message()));
    }
    if (absl::Status s = dt::ParseEnvFile(cli.env_file, *text, &merged.env); !s.ok()) return s;
  }
  for (const std::string& assignment : cli.env) {
    if (absl::Status s = dt::ParseEnvAssignment(assignment, &merged.env); !s.ok()) return s;
  }
  if (cli.exec) {
    if (cli.words.empty()) {
      return absl::InvalidArgumentError("--exec needs the command after --, e.g. --exec -- python3 train.py --lr 3e-4");
    }
    merged.exec_command = cli.words;
    merged.trainer_args.clear();
  } else if (!cli.words.empty()) {
    merged.trainer_args = cli.words;
  }
  if (absl::Status s = CountProcsPerNode(&merged); !s.ok()) return s;
  if (merged.trainer.empty()) merged.trainer = dt::JoinPath(dt::ExecutableDir(), "dttrainer");
  AbsolutizeTrainerPaths(&merged);
  if (!merged.idle_timeout.empty()) {
    if (!cli.exec) {
      return absl::InvalidArgumentError(
          "--idle-timeout applies to --exec programs: dttrainer reports its steps, and a run whose steps stop is "
          "caught by the coordinator's hang timeout");
    }
    if (absl::StatusOr<absl::Duration> idle = ParseIdleTimeout(merged.idle_timeout); !idle.ok()) return idle.status();
  }
  if (merged.name.empty()) return absl::InvalidArgumentError("--name is required (the experiment's name)");
  if (merged.save_dir.empty()) {
    return absl::InvalidArgumentError("--save-dir is required (where experiment directories go)");
  }
  if (!cli.exec) {
    if (std::optional<std::string> misplaced = DtctlFlagAmong(merged.trainer_args)) {
      return absl::InvalidArgumentError(absl::StrCat(
          *misplaced,
          " comes after --, so it would go to dttrainer, which does not take it: put dtctl's flags before --"));
    }
  }
  return merged;
}

int Submit(Global& g, const SubmitCli& cli) {
  absl::StatusOr<SubmitOptions> options = SubmitOptionsOf(cli);
  if (!options.ok()) {
    std::cerr << "dtctl submit: " << options.status().message() << "\n";
    return kUsage;
  }
  if (!cli.dry_run) {
    if (int c = Connect(g); c != kOk) return c;
  }
  if (absl::Status s = Preflight(*options); !s.ok()) {
    std::cerr << "dtctl submit: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? kUsage : kFailed;
  }
  if (cli.dry_run) {
    absl::StatusOr<std::string> plan = DescribeLaunch(*options, g.coordinator);
    if (!plan.ok()) {
      std::cerr << "dtctl submit: " << plan.status().message() << "\n";
      return kFailed;
    }
    std::cout << *plan;
    return kOk;
  }
  absl::StatusOr<Submitted> run = SubmitAndLaunch(g.client, *options, g.tls_ca);
  if (!run.ok()) return Fail(g, run.status(), "submit");
  if (g.output == "json") {
    PrintJson({{"run_id", run->run_id},
               {"exp_dir", run->exp_dir},
               {"job_id", run->job_id},
               {"resume_step", run->resume_step}});
  } else {
    std::cout << run->run_id << "\n";
    std::cerr << "submitted " << run->run_id << " (" << options->scheduler << " " << run->job_id << "), exp dir "
              << run->exp_dir << (run->resume_step > 0 ? absl::StrCat(", resuming from step ", run->resume_step) : "")
              << "\n  dtctl watch " << run->run_id << "\n";
  }
  if (cli.follow) return Watch(g.client, run->run_id, ::isatty(STDOUT_FILENO) && g.output != "json", std::cout);
  return kOk;
}

// The subcommands that read or change one run, and their arguments.
struct RunCommands {
  std::string run_id;
  std::optional<int> rank;
  LogsQuery logs_query;
  bool verify = false;
  std::string key;
  CLI::App *list, *status, *watch, *logs, *metrics, *checkpoints, *cancel, *stacks;
  std::optional<int64_t> generation;
  bool stored = false;
};

void DeclareRunCommands(CLI::App& app, RunCommands& c) {
  c.list = app.add_subcommand("list", "list runs, newest first");
  c.status = app.add_subcommand("status", "one run: state, ranks, root cause, Slurm job");
  c.watch = app.add_subcommand("watch", "live progress until the run ends; exit 0 only if it SUCCEEDED");
  c.logs = app.add_subcommand("logs", "trainer output (<exp_dir>/logs/rank-<R>.log)");
  c.logs->add_option("--rank", c.rank, "only this rank")->check(dt::InRange(0, dt::kMaxWorldSize - 1));
  c.logs->add_flag("-f,--follow", c.logs_query.follow, "keep printing until the run ends");
  c.logs->add_flag("--all", c.logs_query.all,
                   "every rank's lines in one stream, in time order, each prefixed [rank R]");
  c.logs->add_flag("--fold", c.logs_query.fold,
                   "with --all: a line every rank printed alike is shown once, naming the ranks");
  c.logs->add_option("--grep", c.logs_query.grep, "only lines this regular expression (RE2) finds");
  c.metrics = app.add_subcommand("metrics", "metric history (-o json|csv|table)");
  c.metrics->add_option("--key", c.key, "only this metric (e.g. loss)");
  c.metrics->add_option("--rank", c.rank, "only this rank")->check(dt::InRange(0, dt::kMaxWorldSize - 1));
  c.checkpoints = app.add_subcommand("checkpoints", "committed checkpoints of a run");
  c.checkpoints->add_flag("--verify", c.verify,
                          "read every file again and check its size and SHA-256 against what the writer recorded "
                          "(from a machine that sees the save dir; exit 1 if one differs)");
  c.cancel = app.add_subcommand("cancel", "cancel a run (and its Slurm job); harmless when repeated");
  c.stacks = app.add_subcommand(
      "stacks",
      "stacks of every rank's processes: captured now while the run trains (it goes on), else the captures kept "
      "(every hang's), with the verdict: identical stacks grouped, the odd one out named");
  c.stacks->add_option("--rank", c.rank, "only this rank's stacks")->check(dt::InRange(0, dt::kMaxWorldSize - 1));
  c.stacks->add_option("--generation", c.generation, "the capture kept for this generation")
      ->check(dt::InRange(0, 1 << 30));
  c.stacks->add_flag("--stored", c.stored, "the captures kept, even while the run trains");
  for (CLI::App* sub : {c.status, c.watch, c.logs, c.metrics, c.checkpoints, c.cancel, c.stacks}) {
    sub->add_option("RUN_ID", c.run_id, "run id (dtctl list shows them)")->required();
  }
}

int RunSubcommand(Global& g, const RunCommands& c) {
  if (int code = Connect(g); code != kOk) return code;
  if (c.list->parsed()) return List(g);
  if (c.status->parsed()) return Status(g, c.run_id);
  if (c.watch->parsed()) return Watch(g.client, c.run_id, ::isatty(STDOUT_FILENO) != 0, std::cout);
  if (c.logs->parsed()) {
    if (c.logs_query.fold && !c.logs_query.all) {
      std::cerr << "dtctl logs: --fold folds the one stream of --all: add --all\n";
      return kUsage;
    }
    return Logs(g, c.run_id, c.rank, c.logs_query);
  }
  if (c.metrics->parsed()) return Metrics(g, c.run_id, c.key, c.rank);
  if (c.checkpoints->parsed()) return Checkpoints(g, c.run_id, c.verify);
  if (c.cancel->parsed()) return Cancel(g, c.run_id);
  if (c.stacks->parsed()) return Stacks(g, {c.run_id, c.rank, c.generation, c.stored});
  return kUsage;
}

// What the rendered sbatch script calls (hidden from --help).
struct BatchScriptCommands {
  std::string run_id, job_id, allocation, srun_log;
  int64_t step_generation = 0;
  int step_exit_code = 0;
  CLI::App *await_restart, *requeue_wanted, *exclude_failed, *await_silent, *report_step;
};

void DeclareBatchScriptCommands(CLI::App& app, BatchScriptCommands& c) {
  c.await_restart = app.add_subcommand("await-restart", "exit 0 when the run wants another generation");
  c.requeue_wanted = app.add_subcommand("requeue-wanted", "exit 0 when the run waits for its job to be requeued");
  c.exclude_failed = app.add_subcommand(
      "exclude-failed-nodes", "exclude the nodes Slurm shows failed from the run's job; requeue off excluded ones");
  c.exclude_failed->add_option("--job", c.job_id, "the Slurm job ($SLURM_JOB_ID)")->required();
  c.exclude_failed->add_option("--allocation", c.allocation, "the job's nodes ($SLURM_JOB_NODELIST)")->required();
  c.await_silent = app.add_subcommand("await-silent-node", "give Slurm time to tell whether a silent node is dead");
  c.await_silent->add_option("--allocation", c.allocation, "the job's nodes ($SLURM_JOB_NODELIST)")->required();
  c.report_step = app.add_subcommand("report-step", "report how an srun step ended");
  c.report_step->add_option("--generation", c.step_generation, "the generation the step ran (await-restart printed it)")
      ->required();
  c.report_step->add_option("--exit-code", c.step_exit_code, "srun's exit code")->required();
  c.report_step->add_option("--srun-log", c.srun_log, "srun's stderr")->required();
  for (CLI::App* sub : {c.await_restart, c.requeue_wanted, c.exclude_failed, c.await_silent, c.report_step}) {
    sub->add_option("RUN_ID", c.run_id, "run id (dtctl list shows them)")->required();
    sub->group("");
  }
}

int BatchScriptCommand(Global& g, const BatchScriptCommands& c) {
  if (int code = Connect(g); code != kOk) return code;
  if (c.await_restart->parsed()) return AwaitRestart(g, c.run_id);
  if (c.requeue_wanted->parsed()) return RequeueWanted(g, c.run_id);
  if (c.await_silent->parsed()) return AwaitSilentNode(g, c.run_id, c.allocation);
  if (c.exclude_failed->parsed()) return ExcludeFailedNodes(g, c.run_id, c.job_id, c.allocation);
  if (c.report_step->parsed()) return ReportStep(g, c.run_id, c.step_generation, c.step_exit_code, c.srun_log);
  return kUsage;
}

CLI::App* DeclareLauncher(CLI::App& app, LocalLaunch& launch) {
  CLI::App* launcher = app.add_subcommand("__launch-local", "internal: the detached local launcher");
  launcher->group("");
  launcher->add_option("--run", launch.run_id)->required();
  launcher->add_option("--trainer", launch.trainer)->required();
  launcher->add_option("--exp-dir", launch.exp_dir)->required();
  launcher->add_option("--nodes", launch.nodes);
  launcher->add_option("--nproc-per-node", launch.procs_per_node);
  launcher->add_option("--omp-threads", launch.omp_threads);
  launcher->add_option("--exec-word", launch.exec_command)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  launcher->add_option("trainer_args", launch.trainer_args)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return launcher;
}

int Launch(const Global& g, LocalLaunch launch) {
  const char* token = std::getenv("DT_RUN_TOKEN");
  launch.run_token = token != nullptr ? token : "";
  launch.coordinator = g.coordinator;
  launch.tls_ca = g.tls_ca;
  return RunLocalLauncher(launch);
}

// A usage error in dtctl's words: an unknown command is named with the list, a missing run id
// points at dtctl list, a trainer flag given before -- says where it goes.
int ExitOnUsageError(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::string what = e.what();
  std::vector<std::string> names;  // the commands --help lists (the batch script's are hidden)
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    known = known || (argc > 1 && sub->get_name() == argv[1]);
    if (!sub->get_group().empty()) names.push_back(sub->get_name());
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::cerr << "dtctl: unknown command \"" << argv[1] << "\" (commands: " << absl::StrJoin(names, ", ")
              << "; see dtctl --help)\n";
    return kUsage;
  }
  if (what == "RUN_ID is required") {
    std::cerr << "dtctl: this command needs a run id, e.g. dtctl status r-0123456789abcdef (dtctl list shows them)\n";
    return kUsage;
  }
  static const char* const kTrainerFlags[] = {
      "--dataset", "--model",     "--max-steps", "--epochs",    "--batch-size", "--seq-len", "--tokenizer-dir",
      "--lr",      "--ckpt-freq", "--log-freq",  "--eval-freq", "--grad-accum", "--seed"};
  for (const char* flag : kTrainerFlags) {
    if (absl::StrContains(what, "not expected") && absl::StrContains(what, flag)) {
      std::cerr << "dtctl: " << flag
                << " is a trainer argument: put it after --, e.g. dtctl submit --name N --save-dir D -- " << flag
                << " VALUE\n";
      return kUsage;
    }
  }
  return dt::ExitOnParseError(app, e, "dtctl", kUsage);
}

}  // namespace
}  // namespace dt::ctl

int main(int argc, char** argv) {
  using namespace dt::ctl;
  // absl's lock-order checking costs a graph update per lock; the tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"dtctl: submit and watch dt training runs (Slurm or local)"};
  app.set_version_flag("--version", std::string(dt::kVersion));
  app.require_subcommand(1);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Global options may also come after the subcommand: `dtctl list -o json`.
  app.fallthrough();
  Global g;
  const char* env_coord = std::getenv("DT_COORDINATOR");
  g.coordinator = env_coord != nullptr && *env_coord != '\0' ? env_coord : "127.0.0.1:50051";
  app.add_option("--coordinator", g.coordinator, "dtcoord address (default: $DT_COORDINATOR, else 127.0.0.1:50051)")
      ->check(dt::HostPort(/*port_zero_ok=*/false));
  app.add_option("--token-file", g.token_file, "token file (default: $DT_TOKEN, else ~/.dt/coord/admin.token)");
  app.add_option("--tls-ca", g.tls_ca, "PEM roots when dtcoord serves TLS");
  app.add_option("-o,--output", g.output, "table or json (metrics: also csv)")
      ->check(CLI::IsMember({"table", "json", "csv"}));
  SubmitCli submit;
  DeclareSubmit(app, submit);
  RunCommands run_commands;
  DeclareRunCommands(app, run_commands);
  BatchScriptCommands batch_script;
  DeclareBatchScriptCommands(app, batch_script);
  LocalLaunch launch;
  CLI::App* launcher = DeclareLauncher(app, launch);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ExitOnUsageError(app, e, argc, argv);
  }
  if (launcher->parsed()) return Launch(g, launch);
  if (submit.command->parsed()) return Submit(g, submit);
  for (CLI::App* sub : {batch_script.await_restart, batch_script.requeue_wanted, batch_script.exclude_failed,
                        batch_script.await_silent, batch_script.report_step}) {
    if (sub->parsed()) return BatchScriptCommand(g, batch_script);
  }
  return RunSubcommand(g, run_commands);
}
