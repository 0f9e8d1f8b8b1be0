#include "client/dtctl/run_follower.h"

#include "common/grpc_status.h"

namespace dt::ctl {

RunFollower::RunFollower(std::shared_ptr<CoordinatorClient> client, std::string run_id, std::function<void()> on_change)
    : client_(std::move(client)), run_id_(std::move(run_id)), on_change_(std::move(on_change)) {}

RunFollower::~RunFollower() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (open_ != nullptr) open_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void RunFollower::Start(absl::Duration retry) {
  thread_ = std::thread([this, retry] { Loop(retry); });
}

std::optional<v1::Run> RunFollower::Take() {
  absl::MutexLock lock(&mu_);
  std::optional<v1::Run> out = std::move(newest_);
  newest_.reset();
  return out;
}

bool RunFollower::Streaming() const {
  absl::MutexLock lock(&mu_);
  return streaming_;
}

absl::Status RunFollower::LastEnd() const {
  absl::MutexLock lock(&mu_);
  return last_end_;
}

bool RunFollower::Ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

namespace {

// A stream that ended with the run (OK after its terminal snapshot) has nothing more to say, and
// asking again cannot change these answers; anything else (the coordinator away or restarting,
// shutting down, overloaded) is asked again.
bool Final(const absl::Status& end) {
  switch (end.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

}  // namespace

void RunFollower::Loop(absl::Duration retry) {
  while (true) {
    absl::Status end = FollowOnce();
    bool again;
    {
      absl::MutexLock lock(&mu_);
      streaming_ = false;
      last_end_ = end;
      ended_ = stop_ || Final(end);
      again = !ended_;
    }
    on_change_();  // the launcher asks with GetRun again while no stream is up
    if (!again) return;
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), retry);
    if (stop_) {
      ended_ = true;
      return;
    }
  }
}

absl::Status RunFollower::FollowOnce() {
  std::unique_ptr<grpc::ClientContext> ctx = client_->Context(absl::InfiniteDuration());
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("the follower stopped");
    open_ = ctx.get();
  }
  v1::WatchRunRequest req;
  req.set_run_id(run_id_);
  std::unique_ptr<grpc::ClientReader<v1::RunEvent>> reader = client_->runs().WatchRun(ctx.get(), req);
  v1::RunEvent event;
  while (reader->Read(&event)) {
    if (!event.has_snapshot()) continue;
    {
      absl::MutexLock lock(&mu_);
      newest_ = std::move(*event.mutable_snapshot());
      streaming_ = true;
    }
    on_change_();
  }
  grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  open_ = nullptr;
  return FromCallStatus(status);
}

}  // namespace dt::ctl
