// The registrants of one generation until every rank has come. Checks each claim against the
// run's shape (nodes × procs per node), tells a retry (same incarnation) from a restarted process
// (new incarnation, which takes over the slot), and assigns ranks once complete.
// Not thread-safe: used under the run's lock.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/pending.h"
#include "coordinator/rank_assignment.h"

namespace dt {

struct Registrant {
  std::string node;
  int local_slot = 0;
  std::string incarnation;
  std::string host;
  int pid = 0;
  std::string version;
  absl::Time registered_at;
  const void* call = nullptr;         // the RPC this registrant waits in (tells a retry's call from the old one)
  std::optional<int> scheduler_task;  // SLURM_PROCID under srun
  bool captures_stacks = false;       // answers stack captures (StacksService)
};

// What a registrant receives: its assignment (the coordinator adds the run's settings).
struct Seat {
  Registrant registrant;
  Assignment assignment;
};

class Rendezvous {
 public:
  // `only_nodes`: the nodes this generation forms on (a shrunk elastic generation); empty: any
  // `nodes` nodes.
  Rendezvous(int nodes, int procs_per_node, std::vector<std::string> only_nodes = {});

  // Adds (or, for the same node and slot, replaces) a registrant. FAILED_PRECONDITION when the
  // claim does not fit the run's shape. A replaced registrant's reply is completed with ABORTED
  // (new incarnation) or CANCELLED (retry of the same incarnation).
  absl::Status Join(Registrant registrant, PendingPtr<Seat> reply, Deferred& deferred);
  // Join's check alone: FAILED_PRECONDITION when the slot is outside the run's processes per node,
  // the node would be one more than the run has, or it is not one of `only_nodes`.
  absl::Status Admits(const std::string& node, int local_slot) const;

  // Drops a registrant whose call ended (its process is gone). False if that call is no longer
  // the slot's (a retry replaced it) or it was not there.
  bool Withdraw(const std::string& node, int local_slot, const std::string& incarnation, const void* call);

  bool complete() const;
  std::vector<Registrant> registrants() const;
  int count() const { return static_cast<int>(slots_.size()); }
  int world_size() const { return nodes_ * procs_per_node_; }

  // Once complete: every registrant with its assignment, ordered by rank; replies are completed.
  std::vector<Seat> Assign(Deferred& deferred);

  // Fails every waiting registrant with `status` and empties the rendezvous.
  void FailAll(const absl::Status& status, Deferred& deferred);

  // "3 of 4 registered (n1/0 host-a, n1/1 host-a, n2/0 host-b); missing: n2/1" — for timeouts.
  std::string Describe() const;

 private:
  struct Entry {
    Registrant registrant;
    PendingPtr<Seat> reply;
  };
  const int nodes_;
  const int procs_per_node_;
  const std::vector<std::string> only_nodes_;
  std::map<std::pair<std::string, int>, Entry> slots_;  // (node, slot) → registrant
  std::map<std::string, int> node_counts_;              // node → registrants on it
};

}  // namespace dt
