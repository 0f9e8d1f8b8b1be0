// The key-value store and the named barriers of a run's current generation. The store is how
// c10d process groups (Gloo, NCCL) initialise through the coordinator; a barrier releases once
// every rank arrived, or fails naming the ranks that did not. Both end with their generation: a
// caller of an old one is told the generation it is in has ended (ABORTED).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class Coordinator::StoreAndBarriers : private ManagerBase {
 public:
  explicit StoreAndBarriers(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // ---- StoreService and BarrierService (codes as store.proto and barrier.proto list them) ----
  // The store of a run's current generation: NOT_FOUND (run), and LiveGeneration's codes
  // (ABORTED for an old generation; a tool without a rank is let in).
  absl::StatusOr<std::shared_ptr<KvStore>> OpenStore(const v1::StoreScope& scope);
  // A Get or Wait timeout: 0 is the run's default; INVALID_ARGUMENT outside 0..a week (the
  // bound Barrier has too).
  absl::StatusOr<absl::Duration> StoreTimeout(int64_t timeout_ms) const;
  // A rank's arrival at a barrier instance; `reply` gets the release, or the failure naming the
  // ranks missing at the timeout. INVALID_ARGUMENT (the request's fields), NOT_FOUND (run), and
  // LiveGeneration's codes.
  void Barrier(const v1::BarrierRequest& request, PendingPtr<v1::BarrierResponse> reply);
  // Arrivals at `request`'s barrier instance that the sender's node relay carries for `ranks`,
  // other ranks of the sender's node (StoreBarrierRequest.relayed_ranks): counted, never answered;
  // a rank that already arrived keeps its own arrival. INVALID_ARGUMENT, counting none, for a rank
  // outside the generation, on another node, the sender itself, a repeat, more than 256, or a
  // request without a sequence (0); FAILED_PRECONDITION before the generation's rendezvous
  // completed; the codes of Barrier for the request itself.
  absl::Status ArriveRelayed(const v1::BarrierRequest& request, const std::vector<int32_t>& ranks);
};

}  // namespace dt
