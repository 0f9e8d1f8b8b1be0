#include "client/store_session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/duration.h"
#include "common/grpc_status.h"
#include "common/log.h"

namespace dt {
absl::Status StatusOf(const v1::StoreResponse& r) {
  if (!r.has_status() || r.status().code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r.status().code()), r.status().message());
}

absl::StatusOr<std::unique_ptr<StoreSession>> StoreSession::Open(std::shared_ptr<CoordinatorClient> client,
                                                                 const std::string& run_id, int64_t generation,
                                                                 int rank) {
  std::unique_ptr<StoreSession> session(new StoreSession());
  session->client_ = std::move(client);
  session->context_ = session->client_->Context(absl::InfiniteDuration());
  session->stream_ = session->client_->store().Session(session->context_.get());
  v1::StoreRequest open;
  v1::StoreScope* scope = open.mutable_open();
  scope->set_run_id(run_id);
  scope->set_generation(generation);
  scope->set_rank(rank);
  absl::StatusOr<v1::StoreResponse> opened = session->Call(std::move(open));
  if (!opened.ok()) return opened.status();
  if (absl::Status s = StatusOf(*opened); !s.ok()) return s;
  session->features_ = opened->features();
  return session;
}

StoreSession::~StoreSession() {
  if (!stream_) return;
  {
    absl::MutexLock lock(&write_mu_);
    stream_->WritesDone();
  }
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  // No caller can be inside Call() now; drop what is in flight and end the call.
  context_->TryCancel();
  v1::StoreResponse ignored;
  while (stream_->Read(&ignored)) {
  }
  (void)stream_->Finish();
}

void StoreSession::Break(absl::Status status) {
  if (broken_.ok()) broken_ = std::move(status);
  answered_.SignalAll();
}

absl::StatusOr<v1::StoreResponse> StoreSession::Call(v1::StoreRequest request) {
  return Send(std::move(request), true);
}

bool StoreSession::Quiescent() const {
  absl::MutexLock lock(&mu_);
  return broken_.ok() && unwaited_error_.ok() && sets_being_written_ == 0 &&
         answered_through_ > last_unwaited_position_;
}

absl::StatusOr<v1::StoreResponse> StoreSession::Send(v1::StoreRequest request, bool report_unwaited_error) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (report_unwaited_error && !unwaited_error_.ok()) {
      absl::Status earlier = std::move(unwaited_error_);
      unwaited_error_ = absl::OkStatus();
      return absl::Status(earlier.code(), absl::StrCat("an earlier set failed: ", earlier.message()));
    }
    id = next_id_++;
    answers_.emplace(id, std::nullopt);
  }
  request.set_id(id);
  uint64_t position = 0;
  Write(request, &position).IgnoreError();  // a broken stream is answered below, as every waiter's
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = answers_.find(id);
    if (it->second.has_value()) {
      v1::StoreResponse answer = std::move(*it->second);
      answers_.erase(it);
      // The server answered this call after every earlier set: those have failed or succeeded.
      unwaited_ = 0;
      answered_through_ = std::max(answered_through_, position);
      if (!reading_) answered_.Signal();  // hand the reading over to another waiter
      return answer;
    }
    if (!broken_.ok()) {
      answers_.erase(it);
      return broken_;
    }
    if (reading_) {
      answered_.Wait(&mu_);
      continue;
    }
    // Nobody reads: this caller does, until its own answer arrives.
    reading_ = true;
    v1::StoreResponse answer;
    mu_.Unlock();
    bool ok = stream_->Read(&answer);
    if (!ok) {
      // Still the reader: nobody else may Read or Finish while the stream ends.
      grpc::Status end = stream_->Finish();
      mu_.Lock();
      reading_ = false;
      finished_ = true;
      absl::Status status = FromCallStatus(end);
      Break(status.ok() ? absl::UnavailableError("the coordinator closed the store stream") : status);
      continue;
    }
    mu_.Lock();
    reading_ = false;
    uint64_t answered = answer.id();
    auto target = answers_.find(answered);
    if (target == answers_.end()) {
      absl::Status s = StatusOf(answer);
      if (answered & kUnwaitedArrival) {
        // The ranks it carried send their own arrivals once the release is late (Agent::AwaitRelay).
        DT_LOG(Warning) << "the coordinator refused a node relay's barrier arrival: " << s.message();
        continue;
      }
      // Otherwise only a set sent without waiting is answered without a caller: it failed.
      if (!s.ok() && unwaited_error_.ok()) unwaited_error_ = s;
      continue;
    }
    target->second = std::move(answer);
    if (answered != id) answered_.SignalAll();
  }
}

absl::Status StoreSession::Set(const std::string& key, std::string value) {
  v1::StoreRequest r;
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(std::move(value));
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  return a.ok() ? StatusOf(*a) : a.status();
}

absl::Status StoreSession::SetNoWait(const std::string& key, std::string value) {
  v1::StoreRequest r;
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(std::move(value));
  r.mutable_set()->set_answer_only_on_error(true);
  bool drain = false;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    r.set_id(next_id_++);
    drain = ++unwaited_ >= kMaxUnanswered;
    ++sets_being_written_;
  }
  uint64_t position = 0;
  absl::Status written = Write(r, &position);
  {
    absl::MutexLock lock(&mu_);
    --sets_being_written_;
    last_unwaited_position_ = std::max(last_unwaited_position_, position);
  }
  if (!written.ok()) return written;
  if (drain) {
    // A cheap synchronous call: its answer comes after every earlier set was handled.
    v1::StoreRequest sync;
    sync.mutable_num_keys();
    absl::StatusOr<v1::StoreResponse> a = Call(std::move(sync));
    if (!a.ok()) return a.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> StoreSession::Get(const std::string& key, absl::Duration timeout) {
  v1::StoreRequest r;
  r.mutable_get()->set_key(key);
  r.mutable_get()->set_timeout_ms(TimeoutMillis(timeout));
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return std::move(*a->mutable_value());
}

absl::StatusOr<int64_t> StoreSession::Add(const std::string& key, int64_t delta) {
  v1::StoreRequest r;
  r.mutable_add()->set_key(key);
  r.mutable_add()->set_delta(delta);
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return a->number();
}

absl::StatusOr<std::string> StoreSession::CompareSet(const std::string& key, std::string expected,
                                                     std::string desired) {
  v1::StoreRequest r;
  r.mutable_compare_set()->set_key(key);
  r.mutable_compare_set()->set_expected(std::move(expected));
  r.mutable_compare_set()->set_desired(std::move(desired));
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return std::move(*a->mutable_value());
}

absl::StatusOr<bool> StoreSession::Check(const std::vector<std::string>& keys) {
  v1::StoreRequest r;
  for (const auto& k : keys) r.mutable_check()->add_keys(k);
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return a->flag();
}

absl::Status StoreSession::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  v1::StoreRequest r;
  for (const auto& k : keys) r.mutable_wait()->add_keys(k);
  r.mutable_wait()->set_timeout_ms(TimeoutMillis(timeout));
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  return a.ok() ? StatusOf(*a) : a.status();
}

absl::StatusOr<bool> StoreSession::DeleteKey(const std::string& key) {
  v1::StoreRequest r;
  r.mutable_delete_key()->set_key(key);
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return a->flag();
}

absl::StatusOr<int64_t> StoreSession::NumKeys() {
  v1::StoreRequest r;
  r.mutable_num_keys();
  absl::StatusOr<v1::StoreResponse> a = Call(std::move(r));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return a->number();
}

uint64_t StoreSession::RequestsWritten() const {
  absl::MutexLock lock(&write_mu_);
  return writes_;
}

absl::Status StoreSession::Write(const v1::StoreRequest& request, uint64_t* position) {
  absl::MutexLock lock(&write_mu_);
  if (position != nullptr) *position = ++writes_;
  if (stream_->Write(request)) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  Break(absl::UnavailableError(absl::StrCat("the store stream to ", client_->address(), " broke while sending")));
  return broken_;
}

v1::StoreRequest StoreSession::BarrierRequest(const std::string& name, uint64_t sequence, absl::Duration timeout) {
  v1::StoreRequest r;
  r.mutable_barrier()->set_name(name);
  r.mutable_barrier()->set_sequence(sequence);
  r.mutable_barrier()->set_timeout_ms(TimeoutMillis(timeout));
  return r;
}

absl::StatusOr<uint64_t> StoreSession::Barrier(const std::string& name, uint64_t sequence, absl::Duration timeout) {
  absl::StatusOr<v1::StoreResponse> a = Call(BarrierRequest(name, sequence, timeout));
  if (!a.ok()) return a.status();
  if (absl::Status s = StatusOf(*a); !s.ok()) return s;
  return static_cast<uint64_t>(a->number());
}

absl::Status StoreSession::ArriveAsRelayMember(const std::string& name, uint64_t sequence, absl::Duration timeout,
                                               const std::vector<int32_t>& carried) {
  v1::StoreRequest r = BarrierRequest(name, sequence, timeout);
  r.mutable_barrier()->set_relay_member(true);
  r.mutable_barrier()->mutable_relayed_ranks()->Add(carried.begin(), carried.end());
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    r.set_id(next_id_++ | kUnwaitedArrival);
  }
  return Write(r);
}

}  // namespace dt
