// This machine's names.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dt {

std::string HostName();
// The node a process belongs to: SLURMD_NODENAME (several slurmd may share a machine), else the
// host name.
std::string NodeName();

// The address of this machine's interface that reaches `host_port` ("host:port", "[v6]:port"):
// how other machines that reach that host are likely to reach this one (no packet is sent).
absl::StatusOr<std::string> LocalAddressTowards(const std::string& host_port);

// A TCP port that was free on all interfaces a moment ago (the kernel's choice). Whoever binds it
// next wins, as with torchrun's own choice of MASTER_PORT.
absl::StatusOr<int> FindFreePort();

}  // namespace dt
