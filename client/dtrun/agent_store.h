// The store torchrun's agent hosts for its workers (TORCHELASTIC_USE_AGENT_STORE=True): a c10d
// TCPStore on group rank 0's node, up before any worker connects, so every worker's
// `init_process_group("env://")` connects as a client to a listening store. Without it rank 0's
// worker hosts the store, and when rank 1's connects first torch's client waits out a one-second
// retry: half of all launches paid it (bench/findings.md).
//
// The store runs in a helper, `dtrun-store` (LibTorch's c10d::TCPStore), started beside the
// workers: loading LibTorch takes most of a second, which dtrun itself must not spend before it
// starts them; the workers spend longer importing torch, so the store is up before they connect.
// Opt-in (dtrun --agent-store, DT_AGENT_STORE=1): the helper is the system LibTorch's TCPStore,
// and workers importing another torch version (a venv's torch 2.x validates the server it
// connects to) may not speak its protocol.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/subprocess.h"

namespace dt::run {

class AgentStore {
 public:
  explicit AgentStore(std::unique_ptr<Subprocess> helper, int port) : helper_(std::move(helper)), port_(port) {}
  int port() const { return port_; }
  pid_t pid() const { return helper_->pid(); }
  // The helper's wait status once it ended (it should outlive the workers); nullopt while it runs.
  std::optional<int> Ended();

 private:
  std::unique_ptr<Subprocess> helper_;  // killed and reaped with this object
  int port_;
};

// Starts `dtrun-store` (beside this executable) on a free port. UNIMPLEMENTED when there is no
// helper (a build without LibTorch): rank 0's worker then hosts the store, as under torchrun's
// c10d rendezvous.
absl::StatusOr<std::unique_ptr<AgentStore>> StartAgentStore();

}  // namespace dt::run
