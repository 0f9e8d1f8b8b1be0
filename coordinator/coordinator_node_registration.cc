// RegisterNode: a node agent registers all of its node's ranks in one call. Each slot is seated
// as Register seats it; NodeSeats gathers the seats into the node's one reply.
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/node_seats.h"
#include "coordinator/request_checks.h"

namespace dt {

void Coordinator::RegisterNode(const v1::RegisterNodeRequest& request, PendingPtr<v1::RegisterNodeResponse> reply) {
  absl::StatusOr<std::vector<v1::RegisterRequest>> checked = NodeSlotRequests(request);
  RunPtr run = OpenRegistration(checked.status(), request.run_id(), reply);
  if (run == nullptr) return;
  const std::vector<v1::RegisterRequest>& slots = *checked;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  if (absl::Status s = AdmitRegistrant(*run, slots.front(), deferred); !s.ok()) {
    deferred.Complete<v1::RegisterNodeResponse>(reply, s);
    return;
  }
  if (run->gen->assigned) {
    if (auto answered = RegisterNodeWithAssignedGeneration(*run, slots, deferred)) {
      deferred.Complete<v1::RegisterNodeResponse>(reply, std::move(*answered));
      return;
    }
  }
  JoinRendezvousAsNode(run, request, slots, reply, deferred);
}

std::optional<absl::StatusOr<v1::RegisterNodeResponse>> Coordinator::RegisterNodeWithAssignedGeneration(
    RunEntry& run, const std::vector<v1::RegisterRequest>& slots, Deferred& deferred) {
  std::vector<v1::RegisterResponse> answers;
  for (const v1::RegisterRequest& slot : slots) {
    std::optional<absl::StatusOr<v1::RegisterResponse>> answered = RegisterWithAssignedGeneration(run, slot, deferred);
    if (!answered) return std::nullopt;  // a slot restarted: the generation failed; all join the next one
    if (!answered->ok()) return answered->status();
    answers.push_back(std::move(**answered));
  }
  return MakeNodeResponse(slots, std::move(answers));
}

void Coordinator::JoinRendezvousAsNode(const RunPtr& run, const v1::RegisterNodeRequest& request,
                                       const std::vector<v1::RegisterRequest>& slots,
                                       const PendingPtr<v1::RegisterNodeResponse>& reply, Deferred& deferred) {
  // Checked before any slot is seated: after that, seating cannot fail halfway.
  for (const v1::RegisterRequest& slot : slots) {
    if (absl::Status s = run->gen->rendezvous.Admits(slot.node(), slot.local_slot()); !s.ok()) {
      deferred.Complete<v1::RegisterNodeResponse>(reply, s);
      return;
    }
  }
  int64_t number = run->gen->number;
  std::weak_ptr<RunEntry> weak_run = run;
  auto seats = NodeSeats::Make(static_cast<int>(slots.size()), [this, weak_run, reply, number,
                                                                request](absl::StatusOr<std::vector<Seat>> seats) {
    if (!seats.ok()) {
      // One slot's wait ended (replaced by another call, or the generation failed): the call's
      // other slots leave the rendezvous with it, as the proto promises.
      WithdrawNodeRegistration(request, reply.get());
      reply->Complete(seats.status());
      return;
    }
    absl::StatusOr<v1::RegisterResponse> shared = AnswerSeat(weak_run, number, seats->front());
    if (!shared.ok()) {
      reply->Complete(shared.status());
      return;
    }
    reply->Complete(MakeNodeResponse(std::move(*shared), *seats));
  });
  for (size_t i = 0; i < slots.size(); ++i) {
    absl::Status s =
        SeatRegistrant(run, MakeRegistrant(slots[i], reply.get()), seats->SlotReply(static_cast<int>(i)), deferred);
    if (!s.ok()) {  // Admits passed, so this is not expected; nothing of the call stays seated
      for (size_t j = 0; j < i; ++j) {
        run->gen->rendezvous.Withdraw(slots[j].node(), slots[j].local_slot(), slots[j].incarnation(), reply.get());
      }
      deferred.Complete<v1::RegisterNodeResponse>(reply, s);
      return;
    }
  }
  // Once every slot of the call is seated: a slot already held by an earlier call of the same
  // agent (a retry) does not add to the count, so the rendezvous may fill before the last slot.
  CompleteRendezvousIfFull(*run, deferred);
}

void Coordinator::WithdrawNodeRegistration(const v1::RegisterNodeRequest& request, const void* call) {
  // All of the call's slots under one lock: a retry cannot land between them.
  DT_OPEN_RUN_OR_RETURN_VOID(run, locked, request.run_id());
  if (!run->gen || run->gen->assigned) return;
  int withdrawn = 0;
  for (const v1::NodeSlot& slot : request.slots()) {
    withdrawn += run->gen->rendezvous.Withdraw(request.node(), slot.local_slot(), slot.incarnation(), call) ? 1 : 0;
  }
  if (withdrawn > 0) {
    DT_LOG(Info) << "run " << request.run_id() << ": " << withdrawn << " slot(s) of node " << request.node()
                 << " withdrawn (their call ended)";
  }
}

}  // namespace dt
