// Stack captures: the evidence of a hang, taken on every node before the generation is stopped,
// and on-demand captures of a run that trains (dtctl stacks). The coordinator asks each rank
// through its heartbeat reply; whoever heartbeats for the rank captures it and answers with
// ReportStacks; the capture completes when every rank that captures answered or at its deadline.
#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crypto.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "common/stack_capture.h"
#include "common/timeout_policy.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/hang_verdict.h"
#include "coordinator/request_checks.h"

namespace dt {
namespace {

// A program that reports no steps: a failure this soon after the generation formed counts as
// before its first step.
constexpr absl::Duration kEarlyFailureWindow = absl::Minutes(1);

// A message with its digits blanked: the same failure names other pids, ports and times each time.
std::string WithoutNumbers(absl::string_view message) {
  std::string out(message);
  for (char& c : out) {
    if (c >= '0' && c <= '9') c = '#';
  }
  return out;
}

std::string HangFilesText(const v1::StackCapture& c) {
  std::string out = absl::StrCat("run ", c.run_id(), ", generation ", c.generation(), "\n", c.reason(), "\n\n",
                                 "verdict: ", c.verdict().summary(), "\n");
  for (const v1::StackGroup& g : c.verdict().groups()) {
    std::vector<int> ranks(g.ranks().begin(), g.ranks().end());
    v1::ThreadStack t;
    *t.mutable_frames() = g.frames();
    absl::StrAppend(&out, "\n", g.odd() ? "odd group" : "group", ": ", ranks.size() == 1 ? "rank " : "ranks ",
                    RankList(ranks), "\n", FormatFrames(t, 40));
  }
  return out;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

// <exp dir>/hangs/gen-<G>/: verdict.txt, rank-<R>.txt and capture.json, written through the run's
// directory without following links.
void WriteHangFiles(const std::string& exp_dir, const v1::ExperimentDirIdentity& identity,
                    const v1::StackCapture& capture) {
  absl::StatusOr<DirFd> exp = OpenExperimentDir(exp_dir, identity);
  absl::StatusOr<DirFd> hangs = exp.ok() ? exp->MakeSub("hangs") : exp.status();
  absl::StatusOr<DirFd> gen = hangs.ok() ? hangs->MakeSub(absl::StrCat("gen-", capture.generation())) : hangs.status();
  absl::Status s = gen.ok() ? gen->WriteFileAtomic("verdict.txt", HangFilesText(capture)) : gen.status();
  for (const v1::RankStacks& r : capture.ranks()) {
    if (s.ok()) s = gen->WriteFileAtomic(absl::StrCat("rank-", r.rank(), ".txt"), FormatRankStacks(r));
  }
  if (s.ok()) s = gen->WriteFileAtomic("capture.json", ToJson(capture));
  if (!s.ok()) {
    DT_LOG(Warning) << "run " << capture.run_id() << ": cannot keep the stacks of generation " << capture.generation()
                    << " in " << exp_dir << "/hangs: " << s.message();
  }
}

}  // namespace

absl::Duration IdleTimeout(const v1::RunSpec& spec) {
  if (spec.exec_command().empty()) return absl::ZeroDuration();  // dttrainer: the step watchdog
  return spec.has_idle_timeout_ms() ? absl::Milliseconds(spec.idle_timeout_ms()) : kDefaultIdleTimeout;
}

absl::Duration Coordinator::CaptureWindow() const {
  return absl::Milliseconds(policy_.heartbeat_interval_ms()) + kStackCaptureAllowance;
}

bool Coordinator::BeginCapture(RunEntry& run, const std::string& reason, std::optional<v1::Failure> hang,
                               PendingPtr<v1::StackCapture> waiter, Deferred& deferred) {
  Generation& g = *run.gen;
  if (g.capture) {  // one capture at a time: join it (a hang turns a live capture into its evidence)
    if (waiter) g.capture->waiting.push_back(std::move(waiter));
    if (hang && !g.capture->hang) {
      g.capture->hang = std::move(hang);
      g.capture->capture.set_live(false);
      g.capture->capture.set_reason(reason);
    }
    return true;
  }
  auto c = std::make_unique<CaptureInProgress>();
  for (const v1::RankStatus& rs : g.ranks) {
    if (rs.captures_stacks() && rs.state() == v1::RankStatus::ACTIVE) c->awaited.insert(rs.rank());
  }
  if (c->awaited.empty()) return false;
  const std::string& run_id = run.stored.run.run_id();
  c->capture.set_capture_id(absl::StrCat("cap-", RandomHex(6)));
  c->capture.set_run_id(run_id);
  c->capture.set_generation(g.number);
  *c->capture.mutable_requested_at() = ToProtoTime(clock_->Now());
  c->capture.set_reason(reason);
  c->capture.set_live(!hang.has_value());
  c->hang = std::move(hang);
  if (waiter) c->waiting.push_back(std::move(waiter));
  std::string capture_id = c->capture.capture_id();
  c->deadline_timer = timers_->Schedule(clock_->Now() + CaptureWindow(),
                                        [this, run_id, capture_id] { OnCaptureDeadline(run_id, capture_id); });
  DT_LOG(Info) << "run " << run_id << " generation " << g.number << ": capturing the stacks of " << c->awaited.size()
               << " rank(s) (" << reason << ")";
  g.capture = std::move(c);
  (void)deferred;
  return true;
}

void Coordinator::CompleteCapture(RunEntry& run, Deferred& deferred) {
  Generation& g = *run.gen;
  std::unique_ptr<CaptureInProgress> c = std::move(g.capture);
  if (!c) return;
  if (c->deadline_timer != 0) timers_->Cancel(c->deadline_timer);
  v1::StackCapture capture = std::move(c->capture);
  std::vector<v1::RankStacks> answers;
  for (auto& [rank, stacks] : c->answers) answers.push_back(std::move(stacks));
  *capture.mutable_verdict() = JudgeHang(answers, static_cast<int>(g.ranks.size()), clock_->Now());
  for (v1::RankStacks& r : answers) *capture.add_ranks() = std::move(r);
  *capture.mutable_completed_at() = ToProtoTime(clock_->Now());
  if (!g.stopped.ok() && c->hang) {
    absl::StrAppend(capture.mutable_reason(), " (the generation ended otherwise before the capture completed)");
  }
  for (PendingPtr<v1::StackCapture>& w : c->waiting) deferred.Complete(w, absl::StatusOr<v1::StackCapture>(capture));
  // Kept off the lock: the database row, and a hang's files in the experiment directory.
  run.unsaved_captures.push_back(capture);
  const v1::Run& r = run.stored.run;
  file_work_->Post(r.run_id(), [this, capture, exp_dir = r.exp_dir(), identity = r.exp_dir_identity()] {
    if (absl::Status s = db_->SaveStackCapture(capture, kLiveCapturesKept); !s.ok()) {
      DT_LOG(Error) << "run " << capture.run_id() << ": cannot store stack capture " << capture.capture_id() << ": "
                    << s.message();
    }
    if (!capture.live()) WriteHangFiles(exp_dir, identity, capture);
    if (absl::StatusOr<RunPtr> run = FindRun(capture.run_id()); run.ok()) {
      RunMutexLock lock(&(*run)->mu);
      auto& unsaved = (*run)->unsaved_captures;
      for (auto it = unsaved.begin(); it != unsaved.end(); ++it) {
        if (it->capture_id() == capture.capture_id()) {
          unsaved.erase(it);
          break;
        }
      }
    }
  });
  if (!c->hang || !g.stopped.ok()) return;
  v1::Failure failure = std::move(*c->hang);
  *failure.mutable_verdict() = capture.verdict();
  absl::StrAppend(failure.mutable_message(), ". Stacks: ", capture.verdict().summary(), " (dtctl stacks ", r.run_id(),
                  "; ", r.exp_dir(), "/hangs/gen-", g.number, "/)");
  if (!capture.verdict().odd_ranks().empty() && failure.rank() < 0 && capture.verdict().odd_ranks_size() == 1) {
    failure.set_rank(capture.verdict().odd_ranks(0));
    failure.set_node(g.ranks[failure.rank()].node());
    failure.set_host(g.ranks[failure.rank()].host());
  }
  FailGeneration(run, failure, deferred);
}

void Coordinator::OnCaptureDeadline(const std::string& run_id, const std::string& capture_id) {
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  if (!run->gen || !run->gen->capture || run->gen->capture->capture.capture_id() != capture_id) return;
  run->gen->capture->deadline_timer = 0;
  CompleteCapture(*run, locked.deferred());
}

void Coordinator::ExcuseFromCapture(RunEntry& run, int rank, Deferred& deferred) {
  CaptureInProgress* c = run.gen ? run.gen->capture.get() : nullptr;
  if (c == nullptr || c->awaited.erase(rank) == 0) return;
  absl::StrAppend(c->capture.mutable_reason(), c->left.empty() ? "; left before answering: rank " : ", ", rank);
  c->left.push_back(rank);
  if (c->awaited.empty()) CompleteCapture(run, deferred);
}

absl::StatusOr<v1::ReportStacksResponse> Coordinator::ReportStacks(const v1::ReportStacksRequest& request) {
  if (absl::Status s = ValidateReportStacksRequest(request); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  absl::StatusOr<Generation*> g = AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
  if (!g.ok()) return g.status();
  CaptureInProgress* c = (*g)->capture.get();
  if (c == nullptr || c->capture.capture_id() != request.capture_id()) {
    return absl::NotFoundError(absl::StrCat("no capture ", request.capture_id(), " is waiting in generation ",
                                            (*g)->number, " of run ", request.run_id(),
                                            " (it completed, or its deadline passed)"));
  }
  v1::RankStacks stacks = request.stacks();
  stacks.set_rank(request.rank());
  c->answers[request.rank()] = std::move(stacks);
  c->awaited.erase(request.rank());
  if (c->awaited.empty()) CompleteCapture(*run, locked.deferred());
  return v1::ReportStacksResponse();
}

void Coordinator::CaptureStacks(const v1::CaptureStacksRequest& request, PendingPtr<v1::StackCapture> reply) {
  DT_OPEN_RUN_OR_REPLY(run, locked, request.run_id(), reply);
  const v1::Run& r = run->stored.run;
  if (IsTerminal(r.state())) {
    locked.deferred().Complete(reply, absl::StatusOr<v1::StackCapture>(absl::FailedPreconditionError(
                                          absl::StrCat("run ", r.run_id(), " has ended (", StateName(r.state()),
                                                       "): nothing to capture; its stored captures are in GetStacks "
                                                       "(dtctl stacks shows them)"))));
    return;
  }
  Generation& g = *run->gen;
  if (!g.assigned || !g.stopped.ok()) {
    locked.deferred().Complete(
        reply, absl::StatusOr<v1::StackCapture>(absl::FailedPreconditionError(absl::StrCat(
                   "run ", r.run_id(), " is ", StateName(r.state()), ": generation ", g.number,
                   " is not training yet; try again once its ranks have registered (dtctl status shows them)"))));
    return;
  }
  if (!BeginCapture(*run, "asked for by dtctl stacks", std::nullopt, reply, locked.deferred())) {
    locked.deferred().Complete(
        reply, absl::StatusOr<v1::StackCapture>(absl::FailedPreconditionError(absl::StrCat(
                   "no rank of generation ", g.number, " of run ", r.run_id(),
                   " captures stacks: its processes are older than this coordinator, or attached without dtrun"))));
  }
}

absl::StatusOr<v1::GetStacksResponse> Coordinator::GetStacks(const v1::GetStacksRequest& request) {
  if (absl::Status s = ValidateGetStacksRequest(request); !s.ok()) return s;
  int limit = request.limit() == 0 ? 10 : request.limit();
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) return found.status();
  std::optional<int64_t> generation =
      request.has_generation() ? std::optional<int64_t>(request.generation()) : std::nullopt;
  std::vector<v1::StackCapture> unsaved;
  {
    RunMutexLock lock(&(*found)->mu);
    for (const v1::StackCapture& c : (*found)->unsaved_captures) {
      if (!generation || c.generation() == *generation) unsaved.push_back(c);
    }
  }
  absl::StatusOr<std::vector<v1::StackCapture>> stored = db_->LoadStackCaptures(request.run_id(), generation, limit);
  if (!stored.ok()) return stored.status();
  v1::GetStacksResponse out;
  for (auto it = unsaved.rbegin(); it != unsaved.rend(); ++it) *out.add_captures() = *it;
  for (v1::StackCapture& c : *stored) {
    bool seen = false;
    for (const v1::StackCapture& u : unsaved) seen = seen || u.capture_id() == c.capture_id();
    if (!seen && out.captures_size() < limit) *out.add_captures() = std::move(c);
  }
  while (out.captures_size() > limit) out.mutable_captures()->RemoveLast();
  return out;
}

void Coordinator::CheckRepeatedHang(const RunEntry& run, v1::Failure& failure) const {
  const std::string& signature = failure.verdict().odd_signature();
  if (signature.empty()) return;
  int allowed = run.stored.run.spec().has_max_identical_hangs() ? run.stored.run.spec().max_identical_hangs() : 1;
  // The run's failures, newest last: the generations just before this one, each ended by a hang
  // with the same odd stack.
  std::vector<int64_t> generations;
  int64_t expect = failure.generation() - 1;
  for (auto it = run.failures.rbegin(); it != run.failures.rend(); ++it) {
    if (it->generation() != expect) {
      if (it->generation() > expect) continue;
      break;
    }
    if (it->kind() != v1::Failure::HANG || it->verdict().odd_signature() != signature) break;
    generations.push_back(it->generation());
    --expect;
  }
  if (static_cast<int>(generations.size()) < allowed) return;
  std::reverse(generations.begin(), generations.end());
  failure.set_kind(v1::Failure::HUNG_REPEATEDLY);
  failure.set_fatal(true);
  failure.set_message(absl::StrCat("generation ", failure.generation(), " hung the way generation",
                                   generations.size() == 1 ? " " : "s ", absl::StrJoin(generations, ", "),
                                   " did (the same odd stack; --max-identical-hangs ", allowed,
                                   "): restarting does not help, the run ends. ", failure.message()));
}

void Coordinator::CheckRepeatedEarlyFailure(const RunEntry& run, v1::Failure& failure) const {
  const Generation& g = *run.gen;
  if (failure.rank() < 0 || failure.exception_type().empty()) return;
  bool steps_expected = run.stored.run.spec().exec_command().empty();
  bool early = false;
  if (g.assigned && g.health) {
    early = steps_expected || g.health->step_reported() ? g.health->step(failure.rank()) <= g.health->start_step()
                                                        : clock_->Now() - g.assigned_at <= kEarlyFailureWindow;
  } else {
    early = true;  // before the rendezvous completed
  }
  failure.set_before_first_step(early);
  if (!early) return;
  for (auto it = run.failures.rbegin(); it != run.failures.rend(); ++it) {
    if (it->generation() >= failure.generation()) continue;
    if (it->generation() != failure.generation() - 1) return;
    if (it->before_first_step() && it->rank() == failure.rank() && it->exception_type() == failure.exception_type() &&
        WithoutNumbers(it->message()) == WithoutNumbers(failure.message()) &&
        (it->kind() == v1::Failure::REPORTED_ERROR || it->kind() == v1::Failure::PROCESS_EXITED)) {
      failure.set_fatal(true);
      absl::StrAppend(failure.mutable_message(), " [the same ", failure.exception_type(), " from rank ", failure.rank(),
                      " ended generation ", it->generation(),
                      " before its first step too: restarting cannot help, so the run ends]");
    }
    return;
  }
}

}  // namespace dt
