// Stack captures (stack_captures.h): the capture's lifetime under the run's lock, its storage off it.
#include "coordinator/stack_captures.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/names.h"
#include "common/run_state.h"
#include "common/stack_capture.h"
#include "common/timeout_policy.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/hang_verdict.h"
#include "coordinator/request_checks.h"

namespace dt {
namespace {

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

absl::Duration Coordinator::StackCaptures::Window() const {
  return absl::Milliseconds(coordinator_.policy_.heartbeat_interval_ms()) + kStackCaptureAllowance;
}

bool Coordinator::StackCaptures::Begin(RunEntry& run, const std::string& reason, std::optional<v1::Failure> hang,
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
  const Clock& clock = *coordinator_.clock_;
  c->capture.set_capture_id(absl::StrCat("cap-", RandomHex(6)));
  c->capture.set_run_id(run_id);
  c->capture.set_generation(g.number);
  *c->capture.mutable_requested_at() = ToProtoTime(clock.Now());
  c->capture.set_reason(reason);
  c->capture.set_live(!hang.has_value());
  c->hang = std::move(hang);
  if (waiter) c->waiting.push_back(std::move(waiter));
  std::string capture_id = c->capture.capture_id();
  c->deadline_timer = coordinator_.timers_->Schedule(clock.Now() + Window(),
                                                     [this, run_id, capture_id] { OnDeadline(run_id, capture_id); });
  DT_LOG(Info) << "run " << run_id << " generation " << g.number << ": capturing the stacks of " << c->awaited.size()
               << " rank(s) (" << reason << ")";
  g.capture = std::move(c);
  (void)deferred;
  return true;
}

void Coordinator::StackCaptures::Complete(RunEntry& run, Deferred& deferred) {
  Generation& g = *run.gen;
  std::unique_ptr<CaptureInProgress> c = std::move(g.capture);
  if (!c) return;
  const Clock& clock = *coordinator_.clock_;
  if (c->deadline_timer != 0) coordinator_.timers_->Cancel(c->deadline_timer);
  v1::StackCapture capture = std::move(c->capture);
  std::vector<v1::RankStacks> answers;
  for (auto& [rank, stacks] : c->answers) answers.push_back(std::move(stacks));
  *capture.mutable_verdict() = JudgeHang(answers, static_cast<int>(g.ranks.size()), clock.Now());
  for (v1::RankStacks& r : answers) *capture.add_ranks() = std::move(r);
  *capture.mutable_completed_at() = ToProtoTime(clock.Now());
  if (!g.stopped.ok() && c->hang) {
    absl::StrAppend(capture.mutable_reason(), " (the generation ended otherwise before the capture completed)");
  }
  for (PendingPtr<v1::StackCapture>& w : c->waiting) deferred.Complete(w, absl::StatusOr<v1::StackCapture>(capture));
  Keep(run, capture);
  if (c->hang && g.stopped.ok()) FailWithEvidence(run, std::move(*c->hang), capture, deferred);
}

void Coordinator::StackCaptures::Keep(RunEntry& run, const v1::StackCapture& capture) {
  run.unsaved_captures.push_back(capture);  // GetStacks shows it until its row is written
  const v1::Run& r = run.stored.run;
  coordinator_.file_work_->Post(r.run_id(), [this, capture, exp_dir = r.exp_dir(), identity = r.exp_dir_identity()] {
    if (absl::Status s = coordinator_.db_->SaveStackCapture(capture, kLiveCapturesKept); !s.ok()) {
      DT_LOG(Error) << "run " << capture.run_id() << ": cannot store stack capture " << capture.capture_id() << ": "
                    << s.message();
    }
    if (!capture.live()) WriteHangFiles(exp_dir, identity, capture);
    DT_OPEN_RUN_OR_RETURN_VOID(saved, locked, capture.run_id());
    auto& unsaved = saved->unsaved_captures;
    for (auto it = unsaved.begin(); it != unsaved.end(); ++it) {
      if (it->capture_id() == capture.capture_id()) {
        unsaved.erase(it);
        break;
      }
    }
  });
}

void Coordinator::StackCaptures::FailWithEvidence(RunEntry& run, v1::Failure failure, const v1::StackCapture& capture,
                                                  Deferred& deferred) {
  const Generation& g = *run.gen;
  const v1::Run& r = run.stored.run;
  *failure.mutable_verdict() = capture.verdict();
  absl::StrAppend(failure.mutable_message(), ". Stacks: ", capture.verdict().summary(), " (dtctl stacks ", r.run_id(),
                  "; ", r.exp_dir(), "/hangs/gen-", g.number, "/)");
  if (failure.rank() < 0 && capture.verdict().odd_ranks_size() == 1) {
    failure.set_rank(capture.verdict().odd_ranks(0));
    failure.set_node(g.ranks[failure.rank()].node());
    failure.set_host(g.ranks[failure.rank()].host());
  }
  coordinator_.FailGeneration(run, failure, deferred);
}

void Coordinator::StackCaptures::OnDeadline(const std::string& run_id, const std::string& capture_id) {
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, run_id);
  if (!run->gen || !run->gen->capture || run->gen->capture->capture.capture_id() != capture_id) return;
  run->gen->capture->deadline_timer = 0;
  Complete(*run, locked.deferred());
}

void Coordinator::StackCaptures::Excuse(RunEntry& run, int rank, Deferred& deferred) {
  CaptureInProgress* c = run.gen ? run.gen->capture.get() : nullptr;
  if (c == nullptr || c->awaited.erase(rank) == 0) return;
  absl::StrAppend(c->capture.mutable_reason(), c->left.empty() ? "; left before answering: rank " : ", ", rank);
  c->left.push_back(rank);
  if (c->awaited.empty()) Complete(run, deferred);
}

absl::StatusOr<v1::ReportStacksResponse> Coordinator::StackCaptures::Report(const v1::ReportStacksRequest& request) {
  if (absl::Status s = ValidateReportStacksRequest(request); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  absl::StatusOr<Generation*> g =
      coordinator_.AssignedRank(*run, request.generation(), request.rank(), request.incarnation());
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
  if (c->awaited.empty()) Complete(*run, locked.deferred());
  return v1::ReportStacksResponse();
}

void Coordinator::StackCaptures::Capture(const v1::CaptureStacksRequest& request, PendingPtr<v1::StackCapture> reply) {
  DT_OPEN_RUN_OR_REPLY(run, locked, request.run_id(), reply);
  const v1::Run& r = run->stored.run;
  auto refuse = [&](std::string message) {
    locked.deferred().Complete(reply, absl::StatusOr<v1::StackCapture>(absl::FailedPreconditionError(message)));
  };
  if (IsTerminal(r.state())) {
    return refuse(
        absl::StrCat("run ", r.run_id(), " has ended (", StateName(r.state()),
                     "): nothing to capture; its stored captures are in GetStacks (dtctl stacks shows them)"));
  }
  Generation& g = *run->gen;
  if (!g.assigned || !g.stopped.ok()) {
    return refuse(absl::StrCat("run ", r.run_id(), " is ", StateName(r.state()), ": generation ", g.number,
                               " is not training yet; try again once its ranks have registered (dtctl status shows "
                               "them)"));
  }
  if (!Begin(*run, "asked for by dtctl stacks", std::nullopt, reply, locked.deferred())) {
    refuse(absl::StrCat("no rank of generation ", g.number, " of run ", r.run_id(),
                        " captures stacks: its processes are older than this coordinator, or attached without dtrun"));
  }
}

void Coordinator::StackCaptures::FailWaiting(RunEntry& run, const absl::Status& status, Deferred& deferred) {
  CaptureInProgress* c = run.gen ? run.gen->capture.get() : nullptr;
  if (c == nullptr) return;
  for (auto& reply : c->waiting) deferred.Complete(reply, absl::StatusOr<v1::StackCapture>(status));
  c->waiting.clear();
}

absl::StatusOr<v1::GetStacksResponse> Coordinator::StackCaptures::Get(const v1::GetStacksRequest& request) {
  if (absl::Status s = ValidateGetStacksRequest(request); !s.ok()) return s;
  int limit = request.limit() == 0 ? 10 : request.limit();
  std::optional<int64_t> generation =
      request.has_generation() ? std::optional<int64_t>(request.generation()) : std::nullopt;
  std::vector<v1::StackCapture> unsaved;
  {
    DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
    for (const v1::StackCapture& c : run->unsaved_captures) {
      if (!generation || c.generation() == *generation) unsaved.push_back(c);
    }
  }
  absl::StatusOr<std::vector<v1::StackCapture>> stored =
      coordinator_.db_->LoadStackCaptures(request.run_id(), generation, limit);
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

}  // namespace dt
