// The ranks of one node share a barrier's outcome through memory. The first rank of the node to
// arrive at a barrier instance is its holder: it arrives as usual and waits for the coordinator's
// answer. Every later rank of the node is a member: its arrival is counted by the coordinator (so
// a timeout still names exactly the ranks that did not come) but never answered; it waits here,
// on a futex, for the outcome the holder publishes. A release then costs the coordinator one
// write per node rather than one per rank, and each member wakes from a futex, not a gRPC read.
//
// One shared-memory segment per (run, generation, node) (client/node_segment.h) holds a small
// table of slots keyed by (barrier name, instance). Ranks that do not use the relay (a Python
// rank, DT_NODE_RELAY=0, a full table) arrive directly and are answered directly; mixing is safe
// because the coordinator counts ranks, and only ranks that took a slot wait on it. If the holder
// loses its store session it wakes the members to arrive again; a holder that dies leaves the
// members to their deadline or to their agent being told to stop (the generation failed).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dt {

class NodeSegment;

// What a holder publishes: the released instance, or why the barrier failed.
struct RelayOutcome {
  absl::Status status;
  uint64_t sequence = 0;
};

class NodeRelay {
 public:
  // Opens (creating when needed) the segment of `run_id`'s `generation` on `node`, and removes the
  // segments of this run's earlier generations on this node (their ranks are gone). The name is
  // removed once `ranks_on_node` openers have it mapped, so nothing is left behind in /dev/shm
  // when they end. Fails when shared memory cannot be used here; the caller then goes without.
  static absl::StatusOr<std::unique_ptr<NodeRelay>> Open(const std::string& run_id, int64_t generation,
                                                         const std::string& node, int ranks_on_node);
  ~NodeRelay();
  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;

  // The segment's name under /dev/shm.
  const std::string& name() const;

  enum class Role { kHolder, kMember, kDirect };
  struct Ticket {
    Role role = Role::kDirect;
    int slot = -1;
    // A member whose arrival the node's last arrival will carry: it sends nothing now.
    bool held_back = false;
    // The node's last arrival: the held-back members it sends with its own arrival.
    std::vector<int32_t> carry;
  };
  // `rank` arrives at instance `sequence` of barrier `name` on this node: the first is the holder;
  // kDirect when every slot is taken (then the rank goes without the relay). When every rank of
  // the node opened this relay, the members' arrivals are held back and the node's last arrival
  // carries them (one message per node, plus the holder's); otherwise each member sends its own.
  Ticket Arrive(const std::string& name, uint64_t sequence, int rank);

  // Ranks of this node that arrived at instance `sequence` of barrier `name` through the relay
  // and have not all read its outcome (0 when no slot holds it): what the node has seen of it.
  int ArrivedAt(const std::string& name, uint64_t sequence) const;

  // A held-back member whose node's last arrival is late (a slow or dead rank): takes its arrival
  // back, so that it sends it itself and the coordinator sees who is here. False when it was
  // carried already (or never held back): nothing to send.
  bool SendHeldBack(const Ticket& ticket, int rank);

  // The holder: makes `outcome` visible to the members (those arrived and any still to come) and
  // wakes them.
  void Publish(const Ticket& ticket, const RelayOutcome& outcome);

  // A member: waits for the holder's outcome, up to `deadline`. `interrupted()` is polled every
  // `poll` (a stopped agent, a lost coordinator): its non-OK status ends the wait, as does
  // InterruptWaiters (UNAVAILABLE). DEADLINE_EXCEEDED names the barrier as `what`.
  absl::StatusOr<RelayOutcome> Wait(const Ticket& ticket, absl::Time deadline, const std::string& what,
                                    const std::function<absl::Status()>& interrupted,
                                    absl::Duration poll = absl::Milliseconds(200));

  // Ends every Wait on this node with UNAVAILABLE, so the members arrive again: a holder whose
  // store session broke (the coordinator restarted) arrives again too, and the new coordinator
  // has none of the earlier arrivals.
  void InterruptWaiters();

  // Removes the segment's name (processes that have it open keep using it).
  void Unlink();

  struct Segment;

 private:
  NodeRelay() = default;
  std::unique_ptr<NodeSegment> shared_;
  Segment* segment_ = nullptr;  // in shared_
};

}  // namespace dt
