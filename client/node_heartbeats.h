// One heartbeat stream for all ranks of a node (RendezvousService.NodeHeartbeats), as a node agent
// speaks for its ranks: the coordinator gets one message per node and interval, and writes an
// answer only when one changed (NodeHeartbeatRequest.answer_changes_only). Each rank's last answer
// stands until the next: a STOP (or a refused rank) ends the heartbeats and calls `on_stop`; a
// stack capture request starts that rank's capture, and again each interval while it stands and
// the rank's last capture is still running (as the per-rank loop does with repeated answers).
//
// Proof of life: with no answer for a third of the patience (the reconnect or heartbeat timeout,
// whichever is longer), the next heartbeat asks for one. A stream that breaks, or an asked-for
// answer that does not come within the patience, is opened again; with no answer for the whole
// patience the node stops, as a rank that cannot reach the coordinator does.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/agent.h"

namespace dt {

class NodeHeartbeats {
 public:
  // `agents` are one node's registered agents of one run and generation, on one client; they
  // outlive this object. `on_stop(reason)` is called at most once, on the heartbeat thread.
  NodeHeartbeats(std::vector<Agent*> agents, std::function<void(const std::string& reason)> on_stop);
  ~NodeHeartbeats();
  NodeHeartbeats(const NodeHeartbeats&) = delete;
  NodeHeartbeats& operator=(const NodeHeartbeats&) = delete;

  // Ends the heartbeats and waits for their thread (safe from that thread, in `on_stop`).
  void Stop();
  // Heartbeats no more for `agent`'s rank (its process ended well; it leaves the run next).
  // An answer about it that comes later is not heeded: once the last rank left, the run has ended
  // and its answer says stop.
  void Drop(const Agent* agent);

 private:
  class Stream;
  void Loop();
  bool AnyActive() const;
  // The heartbeat of every rank not dropped.
  v1::NodeHeartbeatRequest Message(bool changes_only) const;
  // Applies the answers read since the last call; the reason to stop, if one says so.
  std::optional<std::string> Heed(std::vector<v1::NodeHeartbeatResponse> answers);
  void StopAll(const std::string& reason);

  std::vector<Agent*> agents_;
  std::function<void(const std::string&)> on_stop_;
  mutable absl::Mutex mu_;
  std::vector<bool> active_ ABSL_GUARDED_BY(mu_);  // by index into agents_: not dropped
  // Each rank's standing answer, by index into agents_ (heartbeat thread only).
  std::vector<v1::HeartbeatResponse> standing_;
  bool acted_on_job_ = false;  // the coordinator's requeue_job or cancel_job was acted on (Heed runs on one thread)
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace dt
