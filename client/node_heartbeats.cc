#include "client/node_heartbeats.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/slurm_job.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/timeout_policy.h"

namespace dt {
namespace {

// The stream's own refusals (the proto's list); anything else is a broken link, opened again.
bool IsRefusal(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kUnauthenticated || code == absl::StatusCode::kPermissionDenied;
}

}  // namespace

// One opened NodeHeartbeats stream: written from the heartbeat thread, read on a thread of its
// own (gRPC allows one reader and one writer at once), so an answer is never waited for.
class NodeHeartbeats::Stream {
 public:
  explicit Stream(CoordinatorClient& client) : context_(client.Context(absl::InfiniteDuration())) {
    stream_ = client.rendezvous().NodeHeartbeats(context_.get());
    reader_ = std::thread([this] { ReadAll(); });
  }
  ~Stream() { (void)Close(); }

  bool Write(const v1::NodeHeartbeatRequest& message) { return stream_->Write(message); }

  // The answers read since the last call.
  std::vector<v1::NodeHeartbeatResponse> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(answers_, {});
  }
  bool ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

  // Ends the stream (if the coordinator has not) and gives its status: CANCELLED when it was
  // still open.
  absl::Status Close() {
    if (reader_.joinable()) {
      context_->TryCancel();
      reader_.join();
      status_ = FromGrpcStatus(stream_->Finish());
    }
    return status_;
  }

 private:
  void ReadAll() {
    v1::NodeHeartbeatResponse answer;
    while (stream_->Read(&answer)) {
      absl::MutexLock lock(&mu_);
      answers_.push_back(std::move(answer));
      answer.Clear();
    }
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>> stream_;
  absl::Mutex mu_;
  std::vector<v1::NodeHeartbeatResponse> answers_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
  absl::Status status_;
};

NodeHeartbeats::NodeHeartbeats(std::vector<Agent*> agents, std::function<void(const std::string&)> on_stop)
    : agents_(std::move(agents)),
      on_stop_(std::move(on_stop)),
      active_(agents_.size(), true),
      standing_(agents_.size()) {
  thread_ = std::thread([this] { Loop(); });
}

void NodeHeartbeats::Drop(const Agent* agent) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < agents_.size(); ++i) {
    if (agents_[i] == agent) active_[i] = false;
  }
}

NodeHeartbeats::~NodeHeartbeats() { Stop(); }

void NodeHeartbeats::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

bool NodeHeartbeats::AnyActive() const {
  absl::MutexLock lock(&mu_);
  return std::find(active_.begin(), active_.end(), true) != active_.end();
}

v1::NodeHeartbeatRequest NodeHeartbeats::Message(bool changes_only) const {
  v1::NodeHeartbeatRequest m;
  m.set_run_id(agents_.front()->run_id());
  m.set_generation(agents_.front()->generation());
  m.set_answer_changes_only(changes_only);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < agents_.size(); ++i) {
    if (!active_[i]) continue;
    const Agent* agent = agents_[i];
    v1::RankHeartbeat& beat = *m.add_ranks();
    beat.set_rank(agent->rank());
    beat.set_incarnation(agent->incarnation());
    beat.set_step(agent->step_.load());
    beat.set_total_steps(agent->total_steps_.load());
    beat.set_worker_pid(agent->worker_pid_.load());
    beat.set_idle_ms(agent->idle_ms_.load());
  }
  return m;
}

std::optional<std::string> NodeHeartbeats::Heed(std::vector<v1::NodeHeartbeatResponse> answers) {
  std::vector<bool> active;
  {
    absl::MutexLock lock(&mu_);
    active = active_;  // read after the answers arrived: a rank dropped before them is not heeded
  }
  for (v1::NodeHeartbeatResponse& answer : answers) {
    for (v1::NodeHeartbeatResponse::RankAnswer& rank : *answer.mutable_ranks()) {
      // Whichever rank it came for, active or not, and even when a later answer replaces it.
      if (!acted_on_job_ && ActOnJobOfLostBatchHost(rank.reply(), agents_.front()->assignment().exp_dir(),
                                                    agents_.front()->generation(), rank.rank())) {
        acted_on_job_ = true;
      }
      auto it = std::find_if(agents_.begin(), agents_.end(), [&](const Agent* a) { return a->rank() == rank.rank(); });
      const size_t i = static_cast<size_t>(it - agents_.begin());
      if (it == agents_.end() || !active[i]) continue;
      if (rank.code() != 0) return absl::StrCat("the coordinator refused rank ", rank.rank(), ": ", rank.message());
      standing_[i] = std::move(*rank.mutable_reply());
    }
  }
  for (size_t i = 0; i < agents_.size(); ++i) {
    if (!active[i]) continue;
    if (standing_[i].directive() == v1::HeartbeatResponse::STOP) return standing_[i].reason();
    if (!standing_[i].capture_id().empty()) agents_[i]->StartCapture(standing_[i].capture_id());
  }
  return std::nullopt;
}

void NodeHeartbeats::StopAll(const std::string& reason) {
  for (Agent* agent : agents_) agent->stopped_ = true;  // ends barriers waiting in the node relay
  on_stop_(reason);
}

void NodeHeartbeats::Loop() {
  Agent& first = *agents_.front();
  const absl::Duration interval = absl::Milliseconds(first.timeouts().heartbeat_interval_ms());
  const absl::Duration patience = HeartbeatPatience(first.timeouts());
  std::unique_ptr<Stream> stream;
  absl::Time last_answer = absl::Now();          // the registration was just answered
  absl::Time asked_at = absl::InfiniteFuture();  // an answer asked for and not given yet
  bool reconnecting = false;
  absl::Status broke_with;
  while (!stop_.HasBeenNotified()) {
    if (!AnyActive()) {  // every rank left: nothing to say, nothing to wait for
      stream.reset();
      last_answer = absl::Now();
      asked_at = absl::InfiniteFuture();
      if (stop_.WaitForNotificationWithTimeout(interval)) return;
      continue;
    }
    if (stream == nullptr) {
      // Waiting for the channel drives its reconnection: the ranks are heard from within
      // moments of a restarted coordinator's return.
      if (reconnecting) (void)first.client()->WaitConnected(std::max(interval, absl::Seconds(2)));
      if (stop_.HasBeenNotified()) return;
      stream = std::make_unique<Stream>(*first.client());
      asked_at = absl::Now();  // a stream's first message is always answered
    }
    const absl::Time now = absl::Now();
    const bool ask = asked_at == absl::InfiniteFuture() && now - last_answer > patience / 3;
    if (ask) asked_at = now;
    const bool wrote = stream->Write(Message(/*changes_only=*/!ask));
    std::vector<v1::NodeHeartbeatResponse> answers = stream->Take();
    if (!answers.empty()) {
      last_answer = absl::Now();
      asked_at = absl::InfiniteFuture();
      reconnecting = false;
    }
    if (std::optional<std::string> reason = Heed(std::move(answers))) {
      StopAll(*reason);
      return;
    }
    const bool unanswered = asked_at != absl::InfiniteFuture() && absl::Now() - asked_at > patience / 3;
    if (!wrote || stream->ended() || unanswered) {
      absl::Status s = stream->Close();
      stream.reset();
      if (IsRefusal(s.code())) {
        StopAll(absl::StrCat("the coordinator refused this node's heartbeats: ", s.message()));
        return;
      }
      broke_with = unanswered ? absl::DeadlineExceededError("no answer to a heartbeat that asked for one") : s;
      for (Agent* agent : agents_) ++agent->link_breaks_;  // a relay waiter arrives again
      reconnecting = true;
    }
    if (absl::Now() - last_answer > patience) {
      StopAll(absl::StrCat("lost the coordinator at ", first.client()->address(), " for ",
                           absl::FormatDuration(absl::Now() - last_answer), ": ", broke_with.message()));
      return;
    }
    if (stop_.WaitForNotificationWithTimeout(interval)) return;
  }
}

}  // namespace dt
