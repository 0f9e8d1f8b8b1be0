// dtrun-store PORT: hosts a c10d TCPStore server on PORT (every interface) for the workers of
// group rank 0's dtrun, until dtrun ends it (SIGKILL) or dies. See client/dtrun/agent_store.h.
#include <signal.h>
#include <sys/prctl.h>

#include <cstdio>
#include <exception>
#include <string>

#include "absl/strings/numbers.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

int main(int argc, char** argv) {
  int port = 0;
  if (argc != 2 || !absl::SimpleAtoi(argv[1], &port) || port < 1 || port > 65535) {
    std::fprintf(stderr, "usage: dtrun-store PORT (1..65535; started by dtrun on group rank 0's node)\n");
    return 2;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives dtrun
  // The signals a step's processes get from outside (Slurm's SIGUSR2 before preemption or the time
  // limit, scancel's SIGTERM, a terminal's SIGINT) are for the ranks and dtrun: the ranks may still
  // need the store while they checkpoint and leave, and dtrun ends it once they have. Before the
  // server's threads exist, so they inherit it.
  for (int ignored : {SIGTERM, SIGINT, SIGUSR2}) ::signal(ignored, SIG_IGN);
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;  // the workers count themselves in; nothing here waits for them
  try {
    c10d::TCPStore store("127.0.0.1", o);
    while (true) ::pause();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrun-store: cannot host the workers' TCPStore on port %s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}
