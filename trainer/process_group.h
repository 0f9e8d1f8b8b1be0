// The c10d process group of a generation: Gloo on CPU (always built), NCCL when this binary was
// built against a CUDA LibTorch (USE_C10D_NCCL) and a GPU is present.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include "trainer/comm_group.h"

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace dt {

// What this binary can run, for `dttrainer --version`: the LibTorch it was built against and its
// backends, e.g. "LibTorch 2.11.0, backends gloo nccl (1 CUDA device)" ("backends gloo" on CPU).
std::string DescribeBackends();

// "gloo", "nccl", or "" for the default (nccl when CUDA is there, else gloo).
absl::StatusOr<std::string> ResolveBackend(const std::string& requested);

// Builds the group through `store`. Gloo's device comes from GLOO_SOCKET_IFNAME when set (as
// torchrun users expect), else the host name, else Gloo's default. NCCL uses device local_rank.
absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateProcessGroup(const std::string& backend,
                                                                 const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                                 int world_size, int local_rank,
                                                                 std::chrono::milliseconds timeout);

// Ends an NCCL group's communicators before the process exits: shut down after a clean run (else
// LibTorch 2.x warns that the group was never destroyed), aborted after a failure (a peer that
// died leaves a destroy waiting on it). Nothing to do for Gloo. Never throws.
void CloseProcessGroup(CommGroup& group, bool clean);

}  // namespace dt
