// Keeps gRPC's callback threads from dozing off together, so a call to an idle coordinator is
// answered at once.
//
// Why: Debian's gRPC 1.51 runs every callback-API service on two "nexting" threads (cores / 2,
// at least 2). Each one that finds nothing to do for a second sleeps 100 ms before it looks
// again (src/cpp/common/completion_queue_cc.cc, "idle phase"), and while both sleep nobody
// accepts a connection or runs a handler. Both go idle at the same moment, so the first call
// after about a second of quiet could wait up to 100 ms: `dtctl submit` took 84-104 ms against
// 30-40 ms when it came 1 s after the last call (strace: 28-49 ms before the server's first
// HTTP/2 frame), and so could a rank's store or barrier call after a step of about a second.
//
// The keeper asks the server's own health service over an in-process channel every
// `period` (well under that second), so one of the threads has just had work at any time and
// keeps looking. Its cost: one in-process call per period (about two a second).
#pragma once

#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dt {

class CallbackQueueKeeper {
 public:
  // Starts calling `server`'s grpc.health.v1.Health/Check every `period`. `server` must outlive
  // the keeper, or Stop() must be called before it shuts down.
  CallbackQueueKeeper(grpc::Server* server, absl::Duration period);
  ~CallbackQueueKeeper();

  // Ends the calls and joins the thread; idempotent.
  void Stop();

  // Calls answered so far (tests).
  int64_t calls() const;

 private:
  void Loop();

  std::shared_ptr<grpc::Channel> channel_;
  const absl::Duration period_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace dt
