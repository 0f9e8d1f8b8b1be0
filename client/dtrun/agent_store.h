// The store torchrun's agent hosts for its workers (TORCHELASTIC_USE_AGENT_STORE=True): a c10d
// TCPStore that group rank 0's dtrun starts, listening, before any child exists. Every child's
// `init_process_group("env://")` then connects as a client to a store that is already up. Without
// it rank 0's child hosts the store, and when rank 1's child connects first torch's client waits
// out a one-second retry: half of all launches paid it (bench/findings.md).
#pragma once

#include <memory>

#include "absl/status/statusor.h"

namespace dt::run {

class AgentStore {
 public:
  virtual ~AgentStore() = default;
  // The port the store listens on, on every interface.
  virtual int port() const = 0;
};

// Starts the store on a port the kernel picks. Unimplemented in a build without LibTorch (dtrun
// then lets rank 0's child host the store, as torchrun's c10d rendezvous does).
absl::StatusOr<std::unique_ptr<AgentStore>> StartAgentStore();

}  // namespace dt::run
