#include "client/dtctl/batch_commands.h"

#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/dtctl/node_failure.h"
#include "client/dtctl/slurm.h"
#include "client/dtctl/srun_report.h"
#include "client/slurm_job.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/run_state.h"
#include "common/utf8.h"

namespace dt::ctl {
namespace {

// An elastic run whose generation formed on the nodes that remain (not on the whole allocation).
bool ShrunkElasticGeneration(const v1::Run& r) { return r.spec().min_nodes() > 0 && r.generation_nodes_size() > 0; }

// A shrunk elastic generation without `node`.
bool ElasticGenerationLacks(const v1::Run& r, const std::string& node) {
  return ShrunkElasticGeneration(r) && !absl::c_linear_search(r.generation_nodes(), node);
}

}  // namespace

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

namespace {

// AttachLaunch from the batch script: the job and the node the script runs on (SLURMD_NODENAME,
// the name the ranks' nodes go by; dtctl submit's host stays the launcher host), `requeued` as the
// request's field says.
absl::StatusOr<v1::Run> AttachFromBatchScript(Global& g, const std::string& run_id, const std::string& job_id,
                                              bool requeued) {
  v1::AttachLaunchRequest request;
  request.set_run_id(run_id);
  request.set_scheduler_job_id(job_id);
  request.set_batch_host(NodeName());
  request.set_requeued(requeued);
  return Call(*g.client, &v1::RunService::Stub::AttachLaunch, g.client->runs(), request, absl::Seconds(30));
}

}  // namespace

// Used by the batch script when the job first starts: the coordinator learns the batch host. When
// an elastic run loses that node, Slurm keeps the --no-kill job RUNNING without its script; the
// ranks of up to three nodes that remain are then told to requeue the job (or, once the run failed
// with no restart left, to cancel it), and the one that claims it acts.
int AttachBatch(Global& g, const std::string& run_id, const std::string& job_id) {
  auto reply = AttachFromBatchScript(g, run_id, job_id, /*requeued=*/false);
  if (!reply.ok()) return Fail(g, reply.status(), "attach-batch");
  return kOk;
}

// Used by the batch script of a job Slurm requeued, once the run wants its next generation: records
// the job's new batch host, and tells the coordinator the job was requeued. The job has a whole
// allocation again, so an elastic run's next generation, shrunk to the nodes the old allocation had
// left (which this allocation may not hold), forms on all of the new one.
int AttachRequeued(Global& g, const std::string& run_id, const std::string& job_id) {
  auto before = GetRun(g, run_id);  // only for the message: the attach goes out without it
  auto reply = AttachFromBatchScript(g, run_id, job_id, /*requeued=*/true);
  if (!reply.ok()) return Fail(g, reply.status(), "attach-requeued");
  if (before.ok() && ShrunkElasticGeneration(*before) && !ShrunkElasticGeneration(*reply)) {
    std::cout << "dt: job " << job_id << " was requeued: generation " << reply->generation() << " forms on all "
              << reply->spec().nodes() << " nodes (" << reply->world_size() << " ranks) instead of "
              << absl::StrJoin(before->generation_nodes(), ",") << std::endl;
  }
  return kOk;
}

// Used by the batch script of a job Slurm requeued (a node failure ends a --requeue job NODE_FAIL
// and puts it back in the queue) and before each next generation: the nodes the run's ranks last
// ran on that Slurm shows failed are recorded with the coordinator (the run's excluded nodes, each
// with a NODE_FAILED record) and kept off the job; when this allocation holds an excluded node — a
// failed node back in service, or one the coordinator found unhealthy (NODE_UNHEALTHY) — the job
// is requeued without it and the script ends (exit 5). A node an elastic run's shrunk generation
// goes on without is not excluded while it does: the job keeps its allocation (--no-kill). The next
// generation at full size (a requeue, or fewer than MIN nodes left) excludes it when Slurm still
// shows it failed.
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
      if (ElasticGenerationLacks(*r, node)) {
        std::cout << "dt: node " << node << " failed (" << *evidence << "): generation " << r->generation()
                  << " of the elastic run goes on without it, on " << absl::StrJoin(r->generation_nodes(), ",")
                  << std::endl;
        continue;
      }
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
  if (absl::Status s = RequeueSlurmJob(job_id); !s.ok()) return Fail(g, s, "exclude-failed-nodes");
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
// spend the run's restarts on steps that cannot start). An elastic run's job is not ended by a
// dead node (--no-kill): its generation goes on without the node, or, when it is not elastic
// enough, exclude-failed-nodes requeues the job once Slurm shows the node dead.
int AwaitSilentNode(Global& g, const std::string& run_id, const std::string& allocation) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), "await-silent-node");
  if (!r->has_reason() || r->reason().kind() != v1::Failure::HEARTBEAT_TIMEOUT) return kOk;
  const std::string node = r->reason().node();
  absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(allocation);
  if (!nodes.ok()) return Fail(g, nodes.status(), "await-silent-node");
  if (!absl::c_linear_search(*nodes, node)) return kOk;
  if (ElasticGenerationLacks(*r, node)) {
    std::cout << "dt: a rank on node " << node << " went silent; generation " << r->generation()
              << " of the elastic run goes on without the node, on " << absl::StrJoin(r->generation_nodes(), ",")
              << std::endl;
    return kOk;
  }
  const bool keeps_allocation = r->spec().min_nodes() > 0;
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
    if (dead && keeps_allocation) {
      std::cout << "dt: Slurm reports node " << node << " " << n.state
                << "; the job keeps its allocation (--no-kill) and is requeued without the node" << std::endl;
      return kOk;
    }
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

// Used by an elastic run's sbatch script before each srun step: prints the nodes of the generation
// the step launches, comma-separated, when it formed on some of the allocation's nodes (nothing when
// it spans them all).
int StepNodes(Global& g, const std::string& run_id) {
  auto r = GetRun(g, run_id);
  if (!r.ok()) return Fail(g, r.status(), "step-nodes");
  if (ShrunkElasticGeneration(*r)) {
    std::cout << absl::StrJoin(r->generation_nodes(), ",") << "\n";
  }
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

}  // namespace dt::ctl
