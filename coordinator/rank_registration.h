// Rank registration: a run's trainers (Register, one per rank) or node agents (RegisterNode, one
// per node) take their seats in the current generation's rendezvous; once it is full every seat
// gets its rank, the generation is assigned and the run trains. A registration while the ranks are
// assigned is a retry (the same answer) or a restarted process (its generation fails REPLACED and
// it joins the next). A caller that went away withdraws its seats; a rendezvous that does not fill
// in time fails its generation RENDEZVOUS_TIMEOUT, naming who is missing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "coordinator/manager_base.h"

namespace dt {

class Coordinator::RankRegistration : private ManagerBase {
 public:
  explicit RankRegistration(Coordinator& coordinator) : ManagerBase(coordinator) {}

  // ---- RendezvousService (codes as rendezvous.proto lists them) ----
  // Seats one rank; `reply` gets its assignment once the rendezvous is full (at once for a retry).
  void Register(const v1::RegisterRequest& request, PendingPtr<v1::RegisterResponse> reply);
  // The caller of a waiting Register went away; `call` is the address of that call's reply
  // Pending (a retry of the same incarnation has another).
  void WithdrawRegistration(const std::string& run_id, const std::string& node, int local_slot,
                            const std::string& incarnation, const void* call);
  // A node agent's registration of its node's slots: each slot as Register would seat it, one
  // reply for all.
  void RegisterNode(const v1::RegisterNodeRequest& request, PendingPtr<v1::RegisterNodeResponse> reply);
  // The caller of a waiting RegisterNode went away: its slots still waiting leave the rendezvous.
  void WithdrawNodeRegistration(const v1::RegisterNodeRequest& request, const void* call);

 private:
  // UNAVAILABLE once the coordinator is shutting down.
  absl::Status AcceptingRegistrations() const;
  // The opening of Register and RegisterNode: the request's own fields (`checked`), the run, and
  // whether the coordinator still takes registrations. nullptr once `reply` has the refusal.
  template <typename Response>
  RunPtr OpenRegistration(const absl::Status& checked, const std::string& run_id,
                          const PendingPtr<Response>& reply) const {
    absl::StatusOr<RunPtr> run = checked.ok() ? FindRun(run_id) : absl::StatusOr<RunPtr>(checked);
    if (run.ok()) {
      if (absl::Status s = AcceptingRegistrations(); !s.ok()) run = s;
    }
    if (!run.ok()) {
      reply->Complete(run.status());
      return nullptr;
    }
    return *std::move(run);
  }
  // CountProcsPerNode, then CheckRunAcceptsRegistration.
  absl::Status AdmitRegistrant(RunEntry& run, const v1::RegisterRequest& request, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // A run whose nodes count their own processes (--nproc-per-node gpu|cpu|auto): the first node
  // to register fixes the run's count (and reshapes the generation nobody has joined yet); a node
  // that counted another number ends the run MISCONFIGURED, naming both, since a restart would
  // count the same again. FAILED_PRECONDITION for a refused registrant; OK for every other run.
  absl::Status CountProcsPerNode(RunEntry& run, const v1::RegisterRequest& request, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // FAILED_PRECONDITION when the run has ended or the trainer expects another world shape.
  absl::Status CheckRunAcceptsRegistration(const RunEntry& run, const v1::RegisterRequest& request) const
      ABSL_SHARED_LOCKS_REQUIRED(run.mu);
  Registrant MakeRegistrant(const v1::RegisterRequest& request, const void* call) const;
  // A registration while the ranks are assigned: the answer for a retry (the same seat) or an
  // unknown slot; for a new incarnation of a seated slot, the generation fails (REPLACED) and
  // nothing is returned, so the caller joins the next generation's rendezvous.
  std::optional<absl::StatusOr<v1::RegisterResponse>> RegisterWithAssignedGeneration(RunEntry& run,
                                                                                     const v1::RegisterRequest& request,
                                                                                     Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // RegisterWithAssignedGeneration for each of a node's slots: the node's answer when every slot
  // is a retry, nothing when one was restarted (the generation failed; the slots join the next).
  std::optional<absl::StatusOr<v1::RegisterNodeResponse>> RegisterNodeWithAssignedGeneration(
      RunEntry& run, const std::vector<v1::RegisterRequest>& slots, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Seats the registrant in the current generation's rendezvous; completes it when it is full.
  void JoinRendezvous(const RunPtr& run, const v1::RegisterRequest& request,
                      const PendingPtr<v1::RegisterResponse>& reply, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  void JoinRendezvousAsNode(const RunPtr& run, const v1::RegisterNodeRequest& request,
                            const std::vector<v1::RegisterRequest>& slots,
                            const PendingPtr<v1::RegisterNodeResponse>& reply, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  // Seats a registrant in the current generation's rendezvous: starts its timeout and moves the run
  // to RENDEZVOUS. Join's status otherwise. The caller then calls CompleteRendezvousIfFull (after
  // seating every slot of its call, so a full rendezvous is never assigned halfway through one).
  absl::Status SeatRegistrant(const RunPtr& run, Registrant registrant, PendingPtr<Seat> seat_reply, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->mu);
  void CompleteRendezvousIfFull(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // Assigns every seat its rank: the generation's rank table and health tracker, and RUNNING.
  void CompleteRendezvous(RunEntry& run, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run.mu);
  // `deadline`: the timer's, so that a cancelled timer's late callback changes nothing.
  void OnRendezvousTimeout(const std::string& run_id, int64_t generation, absl::Time deadline);
  // A seat's answer once rendezvous completed, made under the run's lock (the generation may
  // have failed since the seats were handed out: then its status).
  absl::StatusOr<v1::RegisterResponse> AnswerSeat(const std::weak_ptr<RunEntry>& weak_run, int64_t generation,
                                                  const absl::StatusOr<Seat>& seat);
  v1::RegisterResponse MakeRegisterResponse(const RunEntry& run, const Seat& seat) const
      ABSL_SHARED_LOCKS_REQUIRED(run.mu);
};

}  // namespace dt
