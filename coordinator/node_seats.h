// One node agent's registration (RegisterNode): each of its slots waits in the rendezvous as its
// own registrant, and NodeSeats gathers their seats into the node's one reply.
// Thread-safe: slots are seated by whichever thread completes the rendezvous.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/pending.h"
#include "coordinator/rendezvous.h"
#include "dt/v1/rendezvous.pb.h"

namespace dt {

class NodeSeats : public std::enable_shared_from_this<NodeSeats> {
 public:
  using Done = std::function<void(absl::StatusOr<std::vector<Seat>>)>;
  // `done` is called once: with every slot's seat (in slot order as given), or with the first
  // slot's failure. It is called outside NodeSeats' lock.
  static std::shared_ptr<NodeSeats> Make(int slots, Done done);

  // The reply slot `index` waits on in the rendezvous.
  PendingPtr<Seat> SlotReply(int index);

 private:
  NodeSeats(int slots, Done done);
  void OnSeat(int index, absl::StatusOr<Seat> seat);

  absl::Mutex mu_;
  std::vector<std::optional<Seat>> seats_ ABSL_GUARDED_BY(mu_);
  int remaining_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  Done done_;
};

// The node's reply: the fields every slot shares, taken from one slot's RegisterResponse, and
// each slot's rank in the order of `seats`.
v1::RegisterNodeResponse MakeNodeResponse(v1::RegisterResponse shared, const std::vector<Seat>& seats);

// The same from answers already made for each slot of `requests` (a retry after the ranks were
// assigned).
v1::RegisterNodeResponse MakeNodeResponse(const std::vector<v1::RegisterRequest>& requests,
                                          std::vector<v1::RegisterResponse> answers);

}  // namespace dt
