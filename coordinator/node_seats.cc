#include "coordinator/node_seats.h"

#include <utility>

#include "common/node_registration.h"

namespace dt {

std::shared_ptr<NodeSeats> NodeSeats::Make(int slots, Done done) {
  return std::shared_ptr<NodeSeats>(new NodeSeats(slots, std::move(done)));
}

NodeSeats::NodeSeats(int slots, Done done) : seats_(slots), remaining_(slots), done_(std::move(done)) {}

PendingPtr<Seat> NodeSeats::SlotReply(int index) {
  return MakePending<Seat>(
      [self = shared_from_this(), index](absl::StatusOr<Seat> seat) { self->OnSeat(index, std::move(seat)); });
}

void NodeSeats::OnSeat(int index, absl::StatusOr<Seat> seat) {
  absl::StatusOr<std::vector<Seat>> result;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    if (seat.ok()) {
      seats_[index] = std::move(*seat);
      if (--remaining_ > 0) return;
      std::vector<Seat> all;
      all.reserve(seats_.size());
      for (std::optional<Seat>& s : seats_) all.push_back(std::move(*s));
      result = std::move(all);
    } else {
      result = seat.status();
    }
    ended_ = true;
  }
  Done done = std::move(done_);
  done(std::move(result));
}

v1::RegisterNodeResponse MakeNodeResponse(v1::RegisterResponse shared, const std::vector<Seat>& seats) {
  std::vector<v1::RegisterNodeResponse::SlotRank> slots(seats.size());
  for (size_t i = 0; i < seats.size(); ++i) {
    slots[i].set_local_slot(seats[i].registrant.local_slot);
    slots[i].set_rank(seats[i].assignment.rank);
    slots[i].set_local_rank(seats[i].assignment.local_rank);
  }
  return PackNodeAnswer(std::move(shared), std::move(slots));
}

v1::RegisterNodeResponse MakeNodeResponse(const std::vector<v1::RegisterRequest>& requests,
                                          std::vector<v1::RegisterResponse> answers) {
  std::vector<v1::RegisterNodeResponse::SlotRank> slots(answers.size());
  for (size_t i = 0; i < answers.size(); ++i) {
    slots[i].set_local_slot(requests[i].local_slot());
    slots[i].set_rank(answers[i].rank());
    slots[i].set_local_rank(answers[i].local_rank());
  }
  return PackNodeAnswer(std::move(answers.front()), std::move(slots));
}

}  // namespace dt
