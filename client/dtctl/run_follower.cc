#include "client/dtctl/run_follower.h"

#include "common/grpc_status.h"

namespace dt::ctl {

RunFollower::RunFollower(std::shared_ptr<CoordinatorClient> client, std::string run_id,
                         std::function<void()> on_snapshot)
    : client_(std::move(client)), run_id_(std::move(run_id)), on_snapshot_(std::move(on_snapshot)) {}

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

void RunFollower::Loop(absl::Duration retry) {
  while (true) {
    absl::Status end = FollowOnce();
    absl::MutexLock lock(&mu_);
    streaming_ = false;
    last_end_ = end;
    // A stream that ended with the run (OK after its terminal snapshot) has nothing more to say;
    // one the coordinator ended otherwise is opened again after `retry`, until stopped.
    if (stop_ || end.ok()) return;
    mu_.AwaitWithTimeout(absl::Condition(&stop_), retry);
    if (stop_) return;
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
    on_snapshot_();
  }
  grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  open_ = nullptr;
  return FromCallStatus(status);
}

}  // namespace dt::ctl
