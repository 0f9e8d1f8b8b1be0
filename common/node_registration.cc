#include "common/node_registration.h"

#include <utility>

namespace dt {

v1::RegisterNodeRequest PackNodeRegistration(const std::vector<v1::RegisterRequest>& slots) {
  const v1::RegisterRequest& first = slots.front();
  v1::RegisterNodeRequest out;
  out.set_run_id(first.run_id());
  out.set_node(first.node());
  out.set_host(first.host());
  *out.mutable_expected() = first.expected();
  out.set_version(first.version());
  for (const v1::RegisterRequest& own : slots) {
    v1::NodeSlot& slot = *out.add_slots();
    slot.set_local_slot(own.local_slot());
    slot.set_incarnation(own.incarnation());
    slot.set_pid(own.pid());
    if (own.has_scheduler_task()) slot.set_scheduler_task(own.scheduler_task());
    slot.set_captures_stacks(own.captures_stacks());
  }
  return out;
}

v1::RegisterRequest SlotRegistration(const v1::RegisterNodeRequest& request, int index) {
  const v1::NodeSlot& slot = request.slots(index);
  v1::RegisterRequest out;
  out.set_run_id(request.run_id());
  out.set_node(request.node());
  out.set_local_slot(slot.local_slot());
  out.set_incarnation(slot.incarnation());
  out.set_host(request.host());
  out.set_pid(slot.pid());
  *out.mutable_expected() = request.expected();
  out.set_version(request.version());
  if (slot.has_scheduler_task()) out.set_scheduler_task(slot.scheduler_task());
  out.set_captures_stacks(slot.captures_stacks());
  return out;
}

v1::RegisterNodeResponse PackNodeAnswer(v1::RegisterResponse shared,
                                        std::vector<v1::RegisterNodeResponse::SlotRank> slots) {
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
  out.mutable_slots()->Reserve(static_cast<int>(slots.size()));
  for (v1::RegisterNodeResponse::SlotRank& slot : slots) *out.add_slots() = std::move(slot);
  return out;
}

v1::RegisterResponse SlotAnswer(const v1::RegisterNodeResponse& response, int index) {
  const v1::RegisterNodeResponse::SlotRank& slot = response.slots(index);
  v1::RegisterResponse out;
  out.set_rank(slot.rank());
  out.set_local_rank(slot.local_rank());
  out.set_world_size(response.world_size());
  out.set_local_world_size(response.local_world_size());
  out.set_node_rank(response.node_rank());
  out.set_nodes(response.nodes());
  out.set_generation(response.generation());
  out.set_exp_dir(response.exp_dir());
  if (response.has_resume()) *out.mutable_resume() = response.resume();
  *out.mutable_spec() = response.spec();
  *out.mutable_timeouts() = response.timeouts();
  out.set_restarts(response.restarts());
  out.set_run_id(response.run_id());
  return out;
}

}  // namespace dt
