// RegisterNode: a node agent registers all of its node's ranks in one call. Each slot is seated
// as Register seats it; NodeSeats gathers the seats into the node's one reply.
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/node_seats.h"
#include "coordinator/request_checks.h"

namespace dt {

void Coordinator::RegisterNode(const v1::RegisterNodeRequest& request, PendingPtr<v1::RegisterNodeResponse> reply) {
  if (absl::Status s = ValidateRegisterNodeRequest(request); !s.ok()) {
    reply->Complete(s);
    return;
  }
  RunPtr run = FindRunOrReply(request.run_id(), reply);
  if (run == nullptr) return;
  if (absl::Status s = AcceptingRegistrations(); !s.ok()) {
    reply->Complete(s);
    return;
  }
  std::vector<v1::RegisterRequest> slots;
  slots.reserve(request.slots_size());
  for (int i = 0; i < request.slots_size(); ++i) slots.push_back(SlotRegisterRequest(request, i));
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
  JoinRendezvousAsNode(run, slots, reply, deferred);
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
  return MakeNodeResponse(std::move(answers));
}

void Coordinator::JoinRendezvousAsNode(const RunPtr& run, const std::vector<v1::RegisterRequest>& slots,
                                       const PendingPtr<v1::RegisterNodeResponse>& reply, Deferred& deferred) {
  // Checked before any slot is seated, so the rendezvous cannot complete with a slot of a call
  // that then fails.
  for (const v1::RegisterRequest& slot : slots) {
    if (absl::Status s = run->gen->rendezvous.Admits(slot.node(), slot.local_slot()); !s.ok()) {
      deferred.Complete<v1::RegisterNodeResponse>(reply, s);
      return;
    }
  }
  int64_t number = run->gen->number;
  std::weak_ptr<RunEntry> weak_run = run;
  auto seats = NodeSeats::Make(
      static_cast<int>(slots.size()), [this, weak_run, reply, number](absl::StatusOr<std::vector<Seat>> seats) {
        if (!seats.ok()) {
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
    if (!s.ok()) {
      // The slots seated before this one leave with the call.
      for (size_t j = 0; j < i; ++j) {
        run->gen->rendezvous.Withdraw(slots[j].node(), slots[j].local_slot(), slots[j].incarnation(), reply.get());
      }
      deferred.Complete<v1::RegisterNodeResponse>(reply, s);
      return;
    }
  }
}

void Coordinator::WithdrawNodeRegistration(const v1::RegisterNodeRequest& request, const void* call) {
  for (const v1::NodeSlot& slot : request.slots()) {
    WithdrawRegistration(request.run_id(), request.node(), slot.local_slot(), slot.incarnation(), call);
  }
}

}  // namespace dt
