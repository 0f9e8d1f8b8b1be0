// The key-value store and barriers of a run's current generation (store_barriers.h).
#include "coordinator/store_barriers.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/names.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/request_checks.h"

namespace dt {
namespace {

// The time an arrival's barrier waits for the others: its own, or the run's default.
absl::Duration BarrierTimeout(const v1::BarrierRequest& request, const v1::TimeoutPolicy& policy) {
  return absl::Milliseconds(request.timeout_ms() > 0 ? request.timeout_ms() : policy.barrier_timeout_ms());
}

// The ranks a node relay may carry for `sender` at instance `sequence`: other ranks of its node,
// each once. `ranks` is the assigned generation's (one per rank).
absl::Status ValidateRelayedRanks(const std::vector<v1::RankStatus>& ranks, int sender, uint64_t sequence,
                                  const std::vector<int32_t>& relayed) {
  if (relayed.size() > kMaxRelayedRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("a barrier arrival carries at most ", kMaxRelayedRanks, " other ranks, not ", relayed.size()));
  }
  if (sequence == 0) {
    // Sequence 0 lets the server count a rank's arrivals: a carried one could not be told from the
    // rank's own, which it would then replace.
    return absl::InvalidArgumentError(
        "carried arrivals (relayed_ranks) need the instance's sequence (1 or more), not 0");
  }
  if (sender < 0 || sender >= static_cast<int>(ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", sender, " is outside 0..", static_cast<int>(ranks.size()) - 1, " of this generation"));
  }
  const std::string& node = ranks[sender].node();
  absl::flat_hash_set<int32_t> seen;
  for (int32_t r : relayed) {
    if (r < 0 || r >= static_cast<int32_t>(ranks.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("relayed rank ", r, " is outside 0..", ranks.size() - 1, " of this generation"));
    }
    if (r == sender) return absl::InvalidArgumentError(absl::StrCat("rank ", r, " cannot relay its own arrival"));
    if (!seen.insert(r).second) return absl::InvalidArgumentError(absl::StrCat("relayed rank ", r, " is repeated"));
    if (ranks[r].node() != node) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", sender, " on node ", Quote(node),
                                                     " cannot carry the arrival of rank ", r, " on node ",
                                                     Quote(ranks[r].node()), ": a node relay carries its own node's"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<KvStore>> Coordinator::StoreAndBarriers::OpenStore(const v1::StoreScope& scope) {
  DT_OPEN_RUN_OR_RETURN(run, locked, scope.run_id());
  absl::StatusOr<Generation*> g =
      coordinator_.LiveGeneration(*run, scope.generation(), scope.rank(), RankUse::kToolAllowed);
  if (!g.ok()) return g.status();
  return (*g)->store;
}

absl::StatusOr<absl::Duration> Coordinator::StoreAndBarriers::StoreTimeout(int64_t timeout_ms) const {
  if (absl::Status s = ValidateTimeoutMs(timeout_ms); !s.ok()) return s;
  if (timeout_ms > 0) return absl::Milliseconds(timeout_ms);
  return absl::Milliseconds(coordinator_.policy_.store_timeout_ms());
}

void Coordinator::StoreAndBarriers::Barrier(const v1::BarrierRequest& request, PendingPtr<v1::BarrierResponse> reply) {
  if (absl::Status s = ValidateBarrierRequest(request); !s.ok()) {
    reply->Complete(s);
    return;
  }
  DT_OPEN_RUN_OR_REPLY(run, locked, request.run_id(), reply);
  Deferred& deferred = locked.deferred();
  absl::StatusOr<Generation*> g = coordinator_.LiveGeneration(*run, request.generation(), request.rank());
  if (!g.ok()) {
    deferred.Complete<v1::BarrierResponse>(reply, g.status());
    return;
  }
  absl::Duration timeout = BarrierTimeout(request, coordinator_.policy_);
  CoordinatorStats* stats = coordinator_.stats_;
  auto released = MakePending<BarrierRelease>([reply, stats](absl::StatusOr<BarrierRelease> r) {
    if (!r.ok()) {
      reply->Complete(r.status());
      return;
    }
    if (stats != nullptr) stats->ObserveBarrierWait(r->waited);
    v1::BarrierResponse out;
    out.set_sequence(r->sequence);
    out.set_waited_ms(absl::ToInt64Milliseconds(r->waited));
    reply->Complete(out);
  });
  (*g)->barriers->Arrive(request.rank(), request.name(), request.sequence(), timeout, released, deferred);
}

absl::Status Coordinator::StoreAndBarriers::ArriveRelayed(const v1::BarrierRequest& request,
                                                          const std::vector<int32_t>& ranks) {
  if (absl::Status s = ValidateBarrierRequest(request); !s.ok()) return s;
  DT_OPEN_RUN_OR_RETURN(run, locked, request.run_id());
  absl::StatusOr<Generation*> g = coordinator_.LiveGeneration(*run, request.generation(), request.rank());
  if (!g.ok()) return g.status();
  if (!(*g)->assigned) {
    // Nodes are known from the rendezvous on: before it, nobody's node can be checked.
    return absl::FailedPreconditionError(absl::StrCat("generation ", request.generation(), " of run ", request.run_id(),
                                                      " has not completed its rendezvous: no rank can carry another's "
                                                      "barrier arrival before the ranks are assigned to nodes"));
  }
  if (absl::Status s = ValidateRelayedRanks((*g)->ranks, request.rank(), request.sequence(), ranks); !s.ok()) {
    return s;
  }
  absl::Duration timeout = BarrierTimeout(request, coordinator_.policy_);
  for (int32_t r : ranks) {
    (*g)->barriers->ArriveRelayed(r, request.name(), request.sequence(), timeout, locked.deferred());
  }
  return absl::OkStatus();
}

}  // namespace dt
