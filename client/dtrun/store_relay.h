// A relay in front of rank 0's c10d TCPStore for the other ranks of its node.
//
// Under `init_process_group("env://")` rank 0's program hosts the workers' TCPStore, and every
// other rank connects to it. torch's client whose connection is refused, because rank 0 is not
// listening yet, sleeps a whole second before it tries again. Ranks started together finish
// `import torch` within milliseconds of each other, so about half of all launches paid that
// second (bench/findings.md). The relay listens before any rank starts: a rank's connection is
// accepted at once, its bytes wait in the kernel, and the relay connects on to rank 0's store
// every few milliseconds until it listens, then copies both ways until either side closes.
// Nothing of the store's protocol is read or changed; the program sees only another
// MASTER_PORT.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dt::run {

class StoreRelay {
 public:
  // Listens on `addr` (a numeric address or a host name of this machine: the first of its
  // addresses that binds) at a port the kernel picks, other than `avoid_port`, and relays each
  // connection to that address at `target_port`. A connection waits for the target as long as
  // the relay lives: torch's client has its own timeout, and dtrun ends the relay with the ranks.
  // Errors: UNAVAILABLE when `addr` cannot be resolved or bound here.
  static absl::StatusOr<std::unique_ptr<StoreRelay>> Start(const std::string& addr, int target_port, int avoid_port);
  // Closes every connection and joins the threads.
  ~StoreRelay();
  StoreRelay(const StoreRelay&) = delete;
  StoreRelay& operator=(const StoreRelay&) = delete;

  int port() const { return port_; }
  // Connections being relayed, or ended and not yet joined (for tests).
  size_t connections() const;

 private:
  StoreRelay(int listen_fd, int port, std::vector<unsigned char> target);
  void AcceptLoop();
  // Connects `client`'s relay to the target, retrying while it refuses, then copies both ways.
  void Serve(int client);
  // The target's socket once it accepts; -1 when stopping.
  int ConnectToTarget();
  // One connect to the target, given up when stopping: its socket, or -1.
  int TryConnect();
  // Sleeps `millis`, less when told to stop; false when stopping.
  bool Pause(int millis);
  // Keeps `fd` to be shut down on stop; false (and `fd` closed) when already stopping.
  bool Track(int fd);
  bool Stopping() const;

  const int listen_fd_;
  const int port_;
  const std::vector<unsigned char> target_;  // the target's sockaddr, as bytes
  int wake_[2] = {-1, -1};                   // a pipe: written once on stop, wakes the accept loop and the retries

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> open_ ABSL_GUARDED_BY(mu_);  // connections' sockets, shut down on stop
  // One per connection, with whether it has finished: finished ones are joined at the next accept,
  // so a program that opens store connections all run long leaves no threads behind.
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<Connection> connections_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace dt::run
