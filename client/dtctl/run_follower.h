// Follows a run through WatchRun on a thread of its own: the launcher learns of every state and
// generation change as it happens, with one stream instead of a GetRun every 250 ms (each about
// 1 ms of the coordinator's CPU, competing with the ranks' start on a small machine).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"

namespace dt::ctl {

class RunFollower {
 public:
  // `on_change` runs on the follower's thread after each new snapshot is stored and after a
  // stream ends (the launcher wakes its loop with it, to take the snapshot or to start asking
  // with GetRun again); it must not block.
  RunFollower(std::shared_ptr<CoordinatorClient> client, std::string run_id, std::function<void()> on_change);
  // Cancels the stream and joins the thread.
  ~RunFollower();
  RunFollower(const RunFollower&) = delete;
  RunFollower& operator=(const RunFollower&) = delete;

  // Opens the stream. It reopens by itself (every `retry`) after the coordinator ended it or was
  // away, and gives up on a refusal that asking again cannot change (a token refused, an
  // unknown run, a coordinator without WatchRun): LastEnd() then says why.
  void Start(absl::Duration retry = absl::Milliseconds(500));

  // The newest snapshot not yet taken, if one arrived since the last call.
  std::optional<v1::Run> Take();

  // Whether a stream is open and has delivered its first snapshot: while it is, every change of
  // the run reaches Take() without asking.
  bool Streaming() const;

  // Why the last stream ended (OK while none has, and after the run's end), for the launcher's log.
  absl::Status LastEnd() const;
  // Whether the follower gave up (the run ended, a refusal, or stopped).
  bool Ended() const;

 private:
  void Loop(absl::Duration retry);
  // Reads one stream to its end; its status.
  absl::Status FollowOnce();

  const std::shared_ptr<CoordinatorClient> client_;
  const std::string run_id_;
  const std::function<void()> on_change_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::optional<v1::Run> newest_ ABSL_GUARDED_BY(mu_);
  bool streaming_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_end_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* open_ ABSL_GUARDED_BY(mu_) = nullptr;  // the stream to cancel on stop
};

}  // namespace dt::ctl
