#include "coordinator/rendezvous.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/names.h"

namespace dt {

Rendezvous::Rendezvous(int nodes, int procs_per_node, std::vector<std::string> only_nodes)
    : nodes_(nodes), procs_per_node_(procs_per_node), only_nodes_(std::move(only_nodes)) {}

absl::Status Rendezvous::Admits(const std::string& node, int local_slot) const {
  if (local_slot < 0 || local_slot >= procs_per_node_) {
    return absl::FailedPreconditionError(absl::StrCat("local slot ", local_slot, " of node ", Quote(node),
                                                      " is outside 0..", procs_per_node_ - 1, ": the run has ",
                                                      procs_per_node_,
                                                      " processes per node (check --nproc-per-node and "
                                                      "SLURM_LOCALID/LOCAL_RANK)"));
  }
  if (!only_nodes_.empty() && !absl::c_linear_search(only_nodes_, node)) {
    std::vector<std::string> names(only_nodes_.begin(), only_nodes_.begin() + std::min<size_t>(16, only_nodes_.size()));
    if (only_nodes_.size() > names.size()) names.push_back("…");
    return absl::FailedPreconditionError(
        absl::StrCat("node ", Quote(node), " is not one of this generation's ", only_nodes_.size(), " nodes (",
                     absl::StrJoin(names, ", "),
                     "): the elastic run went on with the nodes that remained after a node was lost, "
                     "and forms on all its nodes again at its next full-size generation"));
  }
  if (!node_counts_.count(node) && static_cast<int>(node_counts_.size()) >= nodes_) {
    std::vector<std::string> names;
    for (const auto& [name, n] : node_counts_) {
      if (names.size() == 16) {
        names.push_back("…");
        break;
      }
      names.push_back(name);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", Quote(node), " would be node ", node_counts_.size() + 1, " of a ", nodes_, "-node run (nodes so far: ",
        absl::StrJoin(names, ", "), "); start the run with the right --nodes, or check SLURMD_NODENAME"));
  }
  return absl::OkStatus();
}

absl::Status Rendezvous::Join(Registrant registrant, PendingPtr<Seat> reply, Deferred& deferred) {
  if (absl::Status s = Admits(registrant.node, registrant.local_slot); !s.ok()) return s;
  auto key = std::make_pair(registrant.node, registrant.local_slot);
  auto it = slots_.find(key);
  if (it != slots_.end()) {
    Entry& held = it->second;
    if (held.registrant.incarnation == registrant.incarnation) {
      deferred.Complete<Seat>(held.reply, absl::CancelledError("replaced by a retry of the same registration"));
    } else {
      deferred.Complete<Seat>(held.reply, absl::AbortedError(absl::StrCat(
                                              "node ", Quote(registrant.node), " slot ", registrant.local_slot,
                                              " was taken over by a newer process (pid ", registrant.pid, " on ",
                                              registrant.host, ", incarnation ", registrant.incarnation, ")")));
    }
    held = Entry{std::move(registrant), std::move(reply)};
    return absl::OkStatus();
  }
  ++node_counts_[registrant.node];
  slots_.emplace(key, Entry{std::move(registrant), std::move(reply)});
  return absl::OkStatus();
}

bool Rendezvous::Withdraw(const std::string& node, int local_slot, const std::string& incarnation, const void* call) {
  auto it = slots_.find({node, local_slot});
  if (it == slots_.end() || it->second.registrant.incarnation != incarnation || it->second.registrant.call != call) {
    return false;
  }
  slots_.erase(it);
  if (--node_counts_[node] == 0) node_counts_.erase(node);
  return true;
}

bool Rendezvous::complete() const { return count() == world_size(); }

std::vector<Registrant> Rendezvous::registrants() const {
  std::vector<Registrant> out;
  out.reserve(slots_.size());
  for (const auto& [key, entry] : slots_) out.push_back(entry.registrant);
  return out;
}

std::vector<Seat> Rendezvous::Assign(Deferred& deferred) {
  std::vector<SlotClaim> claims;
  std::vector<Entry*> entries;
  for (auto& [key, entry] : slots_) {
    claims.push_back(SlotClaim{key.first, key.second});
    entries.push_back(&entry);
  }
  std::vector<Assignment> assignments = AssignRanks(claims);
  std::vector<Seat> seats(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    Seat seat{entries[i]->registrant, assignments[i]};
    seats[assignments[i].rank] = seat;
    deferred.Complete<Seat>(entries[i]->reply, seat);
  }
  slots_.clear();
  node_counts_.clear();
  return seats;
}

void Rendezvous::FailAll(const absl::Status& status, Deferred& deferred) {
  for (auto& [key, entry] : slots_) deferred.Complete<Seat>(entry.reply, status);
  slots_.clear();
  node_counts_.clear();
}

std::string Rendezvous::Describe() const {
  std::vector<std::string> came;
  for (const auto& [key, entry] : slots_) {
    if (came.size() == 16) {
      came.push_back("…");
      break;
    }
    came.push_back(absl::StrCat(key.first, "/", key.second, " ", entry.registrant.host));
  }
  // slots_ is ordered by (node, slot): walk it once, noting the gaps in each seen node's slots.
  std::vector<std::string> missing;
  auto it = slots_.begin();
  for (const auto& [node, n] : node_counts_) {
    int expected_slot = 0;
    for (; it != slots_.end() && it->first.first == node; ++it) {
      for (; expected_slot < it->first.second && missing.size() < 16; ++expected_slot) {
        missing.push_back(absl::StrCat(node, "/", expected_slot));
      }
      expected_slot = it->first.second + 1;
    }
    for (; expected_slot < procs_per_node_ && missing.size() < 16; ++expected_slot) {
      missing.push_back(absl::StrCat(node, "/", expected_slot));
    }
  }
  int unseen_nodes = nodes_ - static_cast<int>(node_counts_.size());
  if (unseen_nodes > 0) {
    missing.push_back(absl::StrCat(unseen_nodes, " node", unseen_nodes == 1 ? "" : "s", " never seen (",
                                   unseen_nodes * procs_per_node_, " processes)"));
  }
  return absl::StrCat(count(), " of ", world_size(), " registered (", came.empty() ? "none" : absl::StrJoin(came, ", "),
                      "); missing: ", absl::StrJoin(missing, ", "));
}

}  // namespace dt
