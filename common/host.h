// This machine's names.
#pragma once

#include <string>

namespace dt {

std::string HostName();
// The node a process belongs to: SLURMD_NODENAME (several slurmd may share a machine), else the
// host name.
std::string NodeName();

}  // namespace dt
