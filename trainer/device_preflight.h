// A rank's device pre-flight, before the first step of each generation: a few timed square
// matrix multiplies on the rank's device and one all-reduce across the group. The coordinator
// compares the ranks (a straggler paces every data-parallel step) and names one whose device
// failed or is far slower than the rest (Failure.NODE_UNHEALTHY); on Slurm its node is left out.
#pragma once

#include <torch/torch.h>

#include "dt/v1/common.pb.h"
#include "trainer/comm_group.h"

namespace dt {

// A device error (a CUDA fault, out of memory) is returned in `error`, with the all-reduce
// skipped; an error of the all-reduce itself (a peer died) is thrown as the collective's.
v1::DevicePreflight RunDevicePreflight(CommGroup& group, const torch::Device& device);

}  // namespace dt
