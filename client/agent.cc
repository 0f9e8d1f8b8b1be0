#include "client/agent.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <google/protobuf/text_format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/slurm_job.h"
#include "common/crypto.h"
#include "common/duration.h"
#include "common/env.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/node_registration.h"
#include "common/proto_time.h"
#include "common/timeout_policy.h"
#include "common/utf8.h"

namespace dt {
namespace {

// How long a held-back relay member waits for its node's last arrival to carry its arrival before
// sending it itself (never more than a quarter of the barrier's timeout).
constexpr absl::Duration kSendHeldBackAfter = absl::Seconds(1);

}  // namespace

Agent::Agent(std::shared_ptr<CoordinatorClient> client, AgentOptions options)
    : client_(std::move(client)), options_(std::move(options)), incarnation_(RandomHex(8)) {
  if (Env("DT_NODE_RELAY") == "0") options_.node_relay = false;
}

Agent::~Agent() {
  StopHeartbeats();
  if (capture_thread_.joinable()) capture_thread_.join();
  absl::MutexLock lock(&barrier_mu_);
  if (relay_) relay_->Unlink();  // when not every rank of the node opened it
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::AttachToDtrun() {
  std::vector<std::string> missing;
  auto need = [&missing](const char* name) {
    std::string v = Env(name);
    if (v.empty()) missing.push_back(name);
    return v;
  };
  auto need_int = [&](const char* name) {
    int64_t v = 0;
    std::string text = need(name);
    if (!text.empty() && !absl::SimpleAtoi(text, &v)) missing.push_back(absl::StrCat(name, " (not a number)"));
    return v;
  };
  ClientOptions client;
  client.address = need("DT_COORDINATOR");
  client.token = need("DT_RUN_TOKEN");
  client.tls_ca_file = Env("DT_TLS_CA");
  AgentOptions options;
  options.run_id = need("DT_RUN_ID");
  options.host = HostName();
  options.node = options.host;  // for the node relay: the ranks on this host
  options.pid = ::getpid();
  v1::RegisterResponse a;
  a.set_run_id(options.run_id);
  a.set_generation(need_int("DT_GENERATION"));
  a.set_rank(static_cast<int>(need_int("RANK")));
  a.set_world_size(static_cast<int>(need_int("WORLD_SIZE")));
  a.set_local_rank(static_cast<int>(need_int("LOCAL_RANK")));
  a.set_local_world_size(static_cast<int>(need_int("LOCAL_WORLD_SIZE")));
  a.set_node_rank(static_cast<int>(need_int("GROUP_RANK")));
  a.set_nodes(static_cast<int>(need_int("GROUP_WORLD_SIZE")));
  a.set_exp_dir(need("DT_EXPERIMENT_DIR"));
  if (std::string latest = Env("DT_LATEST_CHECKPOINT"); !latest.empty()) a.mutable_resume()->set_path(latest);
  std::string incarnation = need("DT_INCARNATION");
  if (!google::protobuf::TextFormat::ParseFromString(need("DT_TIMEOUTS"), a.mutable_timeouts())) {
    missing.push_back("DT_TIMEOUTS (unreadable)");
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("not started by dtrun: ", absl::StrJoin(missing, ", "),
                     " missing from the environment (run the program with dtctl submit --exec or dtrun)"));
  }
  options.local_slot = a.local_rank();
  absl::StatusOr<std::shared_ptr<CoordinatorClient>> connected = CoordinatorClient::Connect(client);
  if (!connected.ok()) return connected.status();
  std::unique_ptr<Agent> agent(new Agent(*connected, options));
  agent->incarnation_ = incarnation;
  agent->assignment_ = a;
  agent->registered_ = true;
  return agent;
}

template <typename F>
auto Agent::RetryUnavailable(absl::Time deadline, F call) -> decltype(call(absl::Duration())) {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    auto result = call(deadline - absl::Now());
    absl::Status status;
    if constexpr (std::is_same_v<decltype(result), absl::Status>) {
      status = result;
    } else {
      status = result.status();
    }
    if (status.code() != absl::StatusCode::kUnavailable || absl::Now() + backoff >= deadline) {
      return result;
    }
    if (backoff == absl::Milliseconds(100)) {  // said once per call
      DT_LOG(Warning) << "the coordinator at " << client_->address() << " cannot be reached now (" << status.message()
                      << "); retrying for up to "
                      << absl::FormatDuration(absl::Trunc(deadline - absl::Now(), absl::Seconds(1)))
                      << " (is dtcoord running? a restarting one is back within seconds)";
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

v1::RegisterRequest Agent::RegistrationRequest() const {
  v1::RegisterRequest request;
  request.set_run_id(options_.run_id);
  request.set_node(options_.node);
  request.set_local_slot(options_.local_slot);
  request.set_incarnation(incarnation_);
  request.set_host(options_.host);
  request.set_pid(options_.pid);
  request.set_version(options_.version);
  *request.mutable_expected() = options_.expected;
  if (options_.scheduler_task) request.set_scheduler_task(*options_.scheduler_task);
  request.set_captures_stacks(capturer_ != nullptr);
  return request;
}

absl::StatusOr<v1::RegisterResponse> Agent::Register(absl::Duration timeout) {
  v1::RegisterRequest request = RegistrationRequest();
  absl::StatusOr<v1::RegisterResponse> response = RetryUnavailable(absl::Now() + timeout, [&](absl::Duration left) {
    return Call(*client_, &v1::RendezvousService::Stub::Register, client_->rendezvous(), request, left);
  });
  if (!response.ok()) return response.status();
  assignment_ = *response;
  registered_ = true;
  return assignment_;
}

absl::Status Agent::RegisterNode(const std::vector<Agent*>& agents, absl::Duration timeout) {
  if (agents.empty()) return absl::InvalidArgumentError("a node registers at least one agent");
  Agent& first = *agents.front();
  std::vector<v1::RegisterRequest> slots;
  slots.reserve(agents.size());
  for (Agent* agent : agents) slots.push_back(agent->RegistrationRequest());
  const v1::RegisterNodeRequest request = PackNodeRegistration(slots);
  absl::StatusOr<v1::RegisterNodeResponse> response =
      first.RetryUnavailable(absl::Now() + timeout, [&](absl::Duration left) {
        return Call(*first.client_, &v1::RendezvousService::Stub::RegisterNode, first.client_->rendezvous(), request,
                    left);
      });
  if (response.status().code() == absl::StatusCode::kUnimplemented) {
    return absl::UnimplementedError(absl::StrCat("the coordinator at ", first.client_->address(),
                                                 " does not know RegisterNode: it is older than this dtrun; "
                                                 "upgrade dtcoord to the same version"));
  }
  if (!response.ok()) return response.status();
  if (response->slots_size() != static_cast<int>(agents.size())) {
    return absl::InternalError(
        absl::StrCat("the coordinator answered ", response->slots_size(), " slots for ", agents.size(), " registered"));
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    agents[i]->assignment_ = SlotAnswer(*response, static_cast<int>(i));
    agents[i]->registered_ = true;
  }
  return absl::OkStatus();
}

void Agent::StartHeartbeats(std::function<void(const std::string& reason)> on_stop) {
  heartbeat_thread_ = std::thread([this, on_stop = std::move(on_stop)] {
    HeartbeatLoop([this, &on_stop](const std::string& reason) {
      stopped_ = true;  // ends a barrier waiting in the node relay
      on_stop(reason);
    });
  });
}

void Agent::StopHeartbeats() {
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  if (heartbeat_thread_.joinable()) {
    if (heartbeat_thread_.get_id() == std::this_thread::get_id()) {
      heartbeat_thread_.detach();
    } else {
      heartbeat_thread_.join();
    }
  }
}

void Agent::ReportProgress(int64_t step, int64_t total_steps) {
  step_ = step;
  if (total_steps > 0) total_steps_ = total_steps;
}

void Agent::HeartbeatLoop(std::function<void(const std::string&)> on_stop) {
  absl::Duration interval = absl::Milliseconds(timeouts().heartbeat_interval_ms());
  absl::Duration limit = HeartbeatPatience(timeouts());
  absl::Time last_ok = absl::Now();
  v1::HeartbeatRequest request = RankRequest<v1::HeartbeatRequest>();
  bool reconnecting = false;
  while (true) {
    request.set_step(step_.load());
    request.set_total_steps(total_steps_.load());
    request.set_worker_pid(worker_pid_.load());
    request.set_idle_ms(idle_ms_.load());
    // While the coordinator is away, give each attempt time to connect and handshake with a
    // coordinator that is just starting on a busy machine (a heartbeat interval can be 200 ms).
    absl::Duration deadline = reconnecting ? std::max(interval, absl::Seconds(2)) : interval;
    // Reconnecting, the heartbeat waits for the channel and so drives its reconnection: the rank is
    // heard from within moments of the coordinator's return.
    absl::StatusOr<v1::HeartbeatResponse> reply =
        Call(*client_, &v1::RendezvousService::Stub::Heartbeat, client_->rendezvous(), request, deadline, reconnecting);
    reconnecting = !reply.ok();
    // Before anything else: the coordinator asked this rank to requeue or cancel the job, whatever
    // it does next.
    if (reply.ok()) ActOnJobOfLostBatchHost(*reply, assignment_.exp_dir(), generation(), rank());
    if (stop_heartbeats_.HasBeenNotified()) return;
    if (reply.ok()) {
      if (reply->directive() == v1::HeartbeatResponse::STOP) {
        on_stop(reply->reason());
        return;
      }
      if (!reply->capture_id().empty()) StartCapture(reply->capture_id());
      last_ok = absl::Now();
    } else {
      absl::StatusCode code = reply.status().code();
      ++link_breaks_;
      if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
        on_stop(absl::StrCat("the coordinator refused this rank: ", reply.status().message()));
        return;
      }
      if (absl::Now() - last_ok > limit) {
        on_stop(absl::StrCat("lost the coordinator at ", client_->address(), " for ",
                             absl::FormatDuration(absl::Now() - last_ok), ": ", reply.status().message()));
        return;
      }
    }
    if (stop_heartbeats_.WaitForNotificationWithTimeout(interval)) return;
  }
}

void Agent::StartCapture(const std::string& capture_id) {
  if (capturer_ == nullptr || capture_id == last_capture_) return;
  // One capture at a time: a reply naming another id while one runs is answered by the next
  // heartbeat after it (the coordinator keeps asking until the rank answers).
  if (capture_thread_.joinable()) {
    if (!capture_done_) return;
    capture_thread_.join();
  }
  last_capture_ = capture_id;
  capture_done_ = false;
  capture_thread_ = std::thread([this, capture_id] {
    CaptureAndReport(capture_id);
    capture_done_ = true;
  });
}

void Agent::CaptureAndReport(const std::string& capture_id) {
  absl::Time start = absl::Now();
  v1::ReportStacksRequest request = RankRequest<v1::ReportStacksRequest>();
  request.set_capture_id(capture_id);
  v1::RankStacks* stacks = request.mutable_stacks();
  *stacks = capturer_();
  stacks->set_rank(rank());
  stacks->set_node(options_.node);
  stacks->set_host(options_.host);
  *stacks->mutable_captured_at() = ToProtoTime(start);
  stacks->set_capture_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  absl::StatusOr<v1::ReportStacksResponse> sent =
      Call(*client_, &v1::StacksService::Stub::ReportStacks, client_->stacks(), request, absl::Seconds(10));
  if (!sent.ok())
    DT_LOG(Warning) << "rank " << rank() << ": stacks of capture " << capture_id << " not delivered: " << sent.status();
}

absl::Status Agent::Barrier(const std::string& name, absl::Duration timeout) {
  if (timeout == absl::ZeroDuration()) timeout = absl::Milliseconds(timeouts().barrier_timeout_ms());
  uint64_t sequence;
  {
    absl::MutexLock lock(&barrier_mu_);
    sequence = ++barrier_sequences_[name];
  }
  // The server enforces the timeout; the client allows a little more for the reply to arrive.
  absl::Time deadline = absl::Now() + timeout + absl::Seconds(5);
  NodeRelay* relay = nullptr;
  NodeRelay::Ticket ticket;  // this rank's role on its node, kept across retries
  bool again = false;
  return RetryUnavailable(deadline,
                          [&](absl::Duration left) -> absl::StatusOr<uint64_t> {
                            std::shared_ptr<StoreSession> session;
                            {
                              absl::MutexLock lock(&barrier_mu_);
                              if (!barrier_session_) {
                                absl::StatusOr<std::unique_ptr<StoreSession>> opened = OpenStore();
                                if (!opened.ok()) return opened.status();
                                barrier_session_ = std::move(*opened);
                              }
                              session = barrier_session_;
                              if (relay == nullptr && (relay = RelayLocked()) != nullptr) {
                                ticket = relay->Arrive(name, sequence, rank());
                              }
                            }
                            absl::StatusOr<uint64_t> released =
                                ticket.role == NodeRelay::Role::kMember
                                    ? AwaitRelay(*session, *relay, ticket, name, sequence, timeout, deadline, again)
                                    : session->Barrier(name, sequence, timeout);
                            if (absl::IsUnavailable(released.status())) {
                              again = true;
                              // The holder's members are told to arrive again, as it will.
                              if (ticket.role == NodeRelay::Role::kHolder) relay->InterruptWaiters();
                              absl::MutexLock lock(&barrier_mu_);
                              if (barrier_session_ == session) barrier_session_.reset();  // broken: open anew
                            } else if (ticket.role == NodeRelay::Role::kHolder) {
                              relay->Publish(ticket, RelayOutcome{released.status(), released.value_or(0)});
                            }
                            return released;
                          })
      .status();
}

NodeRelay* Agent::RelayLocked() {
  if (relay_tried_) return relay_.get();
  relay_tried_ = true;
  if (assignment_.local_world_size() <= 1 || options_.node.empty() || !options_.node_relay) return nullptr;
  absl::StatusOr<std::unique_ptr<NodeRelay>> opened =
      NodeRelay::Open(options_.run_id, generation(), options_.node, assignment_.local_world_size());
  if (!opened.ok()) {
    DT_LOG(Warning) << "barriers go without a node relay: " << opened.status().message();
    return nullptr;
  }
  relay_ = std::move(*opened);
  return relay_.get();
}

absl::StatusOr<uint64_t> Agent::AwaitRelay(StoreSession& session, NodeRelay& relay, const NodeRelay::Ticket& ticket,
                                           const std::string& name, uint64_t sequence, absl::Duration timeout,
                                           absl::Time deadline, bool again) {
  uint64_t breaks = link_breaks_.load();
  std::string what = absl::StrCat("barrier \"", name, "\" (instance ", sequence, ")");
  auto interrupted = [&]() -> absl::Status {
    if (stopped_.load()) return absl::AbortedError(absl::StrCat(what, ": this rank was told to stop"));
    if (link_breaks_.load() != breaks) {
      return absl::UnavailableError(absl::StrCat(what, ": the coordinator was unreachable; arriving again"));
    }
    return absl::OkStatus();
  };
  auto released = [](const absl::StatusOr<RelayOutcome>& outcome) -> absl::StatusOr<uint64_t> {
    if (!outcome.ok()) return outcome.status();
    if (!outcome->status.ok()) return outcome->status;
    return outcome->sequence;
  };
  if (ticket.held_back && !again) {
    // Until the node's last rank arrives (and carries this arrival) the coordinator does not know
    // this one is here; if the release is late, this rank tells it itself, well before any
    // timeout, so that `dtctl status` and a timeout name exactly the missing ranks.
    absl::Time send_myself_at = std::min(deadline, absl::Now() + std::min(kSendHeldBackAfter, timeout / 4));
    absl::StatusOr<RelayOutcome> early = relay.Wait(ticket, send_myself_at, what, interrupted);
    if (!absl::IsDeadlineExceeded(early.status()) || absl::Now() >= deadline) return released(early);
  }
  // No longer for the node's last arrival to carry, if it has not taken it yet. Sent in any case,
  // with whatever this rank carries: after a break, or when the last arrival did take it, whether
  // that message counted is unknown (its session may have broken, the coordinator may have refused
  // the carry, or the carrier may have died before sending), and a rank counted twice keeps its
  // own arrival.
  relay.SendHeldBack(ticket, rank());
  if (absl::Status sent = session.ArriveAsRelayMember(name, sequence, timeout, ticket.carry); !sent.ok()) return sent;
  return released(relay.Wait(ticket, deadline, what, interrupted));
}

absl::StatusOr<v1::BeginCheckpointResponse> Agent::BeginCheckpoint(int64_t step, absl::Duration timeout, bool sharded) {
  if (timeout == absl::ZeroDuration()) timeout = absl::Milliseconds(timeouts().barrier_timeout_ms());
  v1::BeginCheckpointRequest request;
  request.set_run_id(options_.run_id);
  request.set_generation(generation());
  request.set_rank(rank());
  request.set_step(step);
  request.set_timeout_ms(TimeoutMillis(timeout));
  request.set_sharded(sharded);
  absl::StatusOr<v1::BeginCheckpointResponse> round =
      RetryUnavailable(absl::Now() + timeout + absl::Seconds(5), [&](absl::Duration left) {
        return Call(*client_, &v1::CheckpointService::Stub::BeginCheckpoint, client_->checkpoints(), request, left);
      });
  if (round.ok() && sharded && !round->sharded()) {
    // A coordinator from before sharded rounds ignores the request and elects one writer.
    std::string reason = "this dtcoord does not offer sharded rounds (it is older than this client): upgrade it";
    (void)AbortCheckpoint(round->round_id(), reason);
    return absl::FailedPreconditionError(reason);
  }
  return round;
}

absl::StatusOr<v1::CheckpointInfo> Agent::CommitCheckpoint(const std::string& round_id, const v1::Manifest* manifest,
                                                           const std::string& layout_json) {
  v1::CommitCheckpointRequest request;
  request.set_run_id(options_.run_id);
  request.set_generation(generation());
  request.set_rank(rank());
  request.set_round_id(round_id);
  if (manifest != nullptr) *request.mutable_manifest() = *manifest;
  request.set_layout_json(layout_json);
  // The lease bounds the writer; verification of the files adds a little.
  absl::Duration timeout = absl::Milliseconds(timeouts().checkpoint_lease_ms()) + absl::Minutes(5);
  absl::StatusOr<v1::CommitCheckpointResponse> reply =
      RetryUnavailable(absl::Now() + timeout, [&](absl::Duration left) {
        return Call(*client_, &v1::CheckpointService::Stub::CommitCheckpoint, client_->checkpoints(), request, left);
      });
  if (!reply.ok()) return reply.status();
  return reply->checkpoint();
}

absl::Status Agent::AbortCheckpoint(const std::string& round_id, const std::string& reason) {
  v1::AbortCheckpointRequest request;
  request.set_run_id(options_.run_id);
  request.set_generation(generation());
  request.set_rank(rank());
  request.set_round_id(round_id);
  request.set_reason(reason);
  return Call(*client_, &v1::CheckpointService::Stub::AbortCheckpoint, client_->checkpoints(), request,
              absl::Seconds(30))
      .status();
}

v1::ReportErrorRequest Agent::ErrorRequest(const std::string& message, const std::string& exception_type,
                                           const std::string& stack, int64_t step) const {
  v1::ReportErrorRequest request = RankRequest<v1::ReportErrorRequest>();
  request.set_node(options_.node);
  request.set_local_slot(options_.local_slot);
  request.set_host(options_.host);
  // Whatever a program printed: valid UTF-8 (protobuf refuses anything else, and the report would
  // be lost) and within the coordinator's limits, keeping each text's head and tail.
  request.set_message(message.empty() ? "unknown error" : HeadAndTailUtf8(message, kMaxMessageBytes));
  request.set_exception_type(TruncateUtf8(exception_type, kMaxNameChars * 2));
  request.set_stack(HeadAndTailUtf8(stack, kMaxMessageBytes));
  request.set_step(step);
  return request;
}

absl::Status Agent::ReportError(const std::string& message, const std::string& exception_type, const std::string& stack,
                                int64_t step, bool fatal) {
  v1::ReportErrorRequest request = ErrorRequest(message, exception_type, stack, step);
  request.set_fatal(fatal);
  return SendError(request);
}

absl::Status Agent::ReportWorkerExit(const std::string& message, const std::string& exception_type,
                                     const std::string& stack, int64_t step) {
  v1::ReportErrorRequest request = ErrorRequest(message, exception_type, stack, step);
  request.set_process_exited(exception_type.empty());
  return SendError(request);
}

absl::Status Agent::SendError(const v1::ReportErrorRequest& request) {
  return RetryUnavailable(absl::Now() + absl::Seconds(10),
                          [&](absl::Duration left) {
                            return Call(*client_, &v1::RendezvousService::Stub::ReportError, client_->rendezvous(),
                                        request, left);
                          })
      .status();
}

absl::Status Agent::ReportStopped(int signal, int64_t step, absl::Duration timeout) {
  if (!registered_) return absl::FailedPreconditionError("not registered yet");
  v1::ReportStoppedRequest request = RankRequest<v1::ReportStoppedRequest>();
  request.set_signal(signal);
  request.set_step(step);
  return Call(*client_, &v1::RendezvousService::Stub::ReportStopped, client_->rendezvous(), request, timeout).status();
}

absl::StatusOr<v1::ReportPreflightResponse> Agent::ReportPreflight(const v1::DevicePreflight& result) {
  v1::ReportPreflightRequest request = RankRequest<v1::ReportPreflightRequest>();
  *request.mutable_result() = result;
  return RetryUnavailable(absl::Now() + absl::Seconds(30), [&](absl::Duration left) {
    return Call(*client_, &v1::RendezvousService::Stub::ReportPreflight, client_->rendezvous(), request, left);
  });
}

bool NearTheJobsTimeLimit(absl::Time now) {
  int64_t end = 0;
  if (!absl::SimpleAtoi(Env("DT_JOB_END_TIME"), &end) || end <= 0) return false;
  int grace = EnvInt("DT_PREEMPT_GRACE", 120);
  return absl::ToUnixSeconds(now) >= end - grace - 60;
}

absl::Status Agent::Leave(int64_t final_step, int preempted_by) {
  v1::LeaveRequest request = RankRequest<v1::LeaveRequest>();
  request.set_preempted(preempted_by != 0);
  request.set_signal(preempted_by);
  request.set_time_limit(preempted_by != 0 && NearTheJobsTimeLimit(absl::Now()));
  request.set_final_step(final_step);
  return RetryUnavailable(absl::Now() + absl::Seconds(30),
                          [&](absl::Duration left) {
                            return Call(*client_, &v1::RendezvousService::Stub::Leave, client_->rendezvous(), request,
                                        left);
                          })
      .status();
}

absl::StatusOr<std::unique_ptr<StoreSession>> Agent::OpenStore() {
  return StoreSession::Open(client_, options_.run_id, generation(), rank());
}

std::unique_ptr<StoreCombiner> Agent::OpenStoreCombiner() {
  if (assignment_.local_world_size() <= 1 || options_.node.empty() || !options_.node_relay) return nullptr;
  absl::StatusOr<std::unique_ptr<StoreCombiner>> opened =
      StoreCombiner::Open(options_.run_id, generation(), options_.node, assignment_.local_world_size());
  if (!opened.ok()) {
    DT_LOG(Warning) << "store adds go without the node's combiner: " << opened.status().message();
    return nullptr;
  }
  return std::move(*opened);
}

}  // namespace dt
