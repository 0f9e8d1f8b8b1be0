// How one node agent's RegisterNode call stands for its slots' Register calls, both ways: the
// agent packs its slots' requests and unpacks each slot's answer (client/agent.cc); dtcoord
// unpacks each slot's request and packs the answers (coordinator/node_seats.cc). One file, so the
// two sides cannot drift apart.
#pragma once

#include <vector>

#include "dt/v1/rendezvous.pb.h"

namespace dt {

// One RegisterNode for `slots` (at least one), which share their run, node, host, expected world
// and version: those are taken from the first.
v1::RegisterNodeRequest PackNodeRegistration(const std::vector<v1::RegisterRequest>& slots);

// The RegisterRequest slot `index` of a RegisterNode stands for.
v1::RegisterRequest SlotRegistration(const v1::RegisterNodeRequest& request, int index);

// The node's answer: the fields every slot shares, taken from one slot's RegisterResponse, and
// each slot's rank in the order the slots were given.
v1::RegisterNodeResponse PackNodeAnswer(v1::RegisterResponse shared,
                                        std::vector<v1::RegisterNodeResponse::SlotRank> slots);

// The RegisterResponse that Register would have given slot `index`.
v1::RegisterResponse SlotAnswer(const v1::RegisterNodeResponse& response, int index);

}  // namespace dt
