// The c10d object that runs collectives. LibTorch 1.13 (Debian) calls it ProcessGroup; LibTorch 2.x
// (the CUDA builds) split it into ProcessGroup and Backend, and ProcessGroupGloo/NCCL are Backends.
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace dt {
using CommGroup = c10d::Backend;
}  // namespace dt
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace dt {
using CommGroup = c10d::ProcessGroup;
}  // namespace dt
#endif
