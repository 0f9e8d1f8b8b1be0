#include "coordinator/node_seats.h"

#include <utility>

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

namespace {

v1::RegisterNodeResponse SharedFields(v1::RegisterResponse& shared) {
  v1::RegisterNodeResponse out;
  out.set_world_size(shared.world_size());
  out.set_local_world_size(shared.local_world_size());
  out.set_node_rank(shared.node_rank());
  out.set_nodes(shared.nodes());
  out.set_generation(shared.generation());
  out.set_exp_dir(std::move(*shared.mutable_exp_dir()));
  if (shared.has_resume()) out.mutable_resume()->Swap(shared.mutable_resume());
  out.mutable_spec()->Swap(shared.mutable_spec());
  out.mutable_timeouts()->Swap(shared.mutable_timeouts());
  out.set_restarts(shared.restarts());
  out.set_run_id(std::move(*shared.mutable_run_id()));
  return out;
}

}  // namespace

v1::RegisterNodeResponse MakeNodeResponse(v1::RegisterResponse shared, const std::vector<Seat>& seats) {
  v1::RegisterNodeResponse out = SharedFields(shared);
  for (const Seat& seat : seats) {
    v1::RegisterNodeResponse::SlotRank& slot = *out.add_slots();
    slot.set_local_slot(seat.registrant.local_slot);
    slot.set_rank(seat.assignment.rank);
    slot.set_local_rank(seat.assignment.local_rank);
  }
  return out;
}

v1::RegisterNodeResponse MakeNodeResponse(std::vector<v1::RegisterResponse> answers) {
  std::vector<Seat> seats(answers.size());
  for (size_t i = 0; i < answers.size(); ++i) {
    seats[i].registrant.local_slot = answers[i].local_rank();
    seats[i].assignment.rank = answers[i].rank();
    seats[i].assignment.local_rank = answers[i].local_rank();
  }
  return MakeNodeResponse(std::move(answers.front()), seats);
}

}  // namespace dt
