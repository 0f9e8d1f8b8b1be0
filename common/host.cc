#include "common/host.h"

#include <unistd.h>

#include <cstdlib>

namespace dt {

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string NodeName() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm != nullptr && *slurm != '\0') return slurm;
  return HostName();
}

}  // namespace dt
