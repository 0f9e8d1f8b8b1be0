// dtrun's work on one node (torchrun's agent, with the coordinator deciding): register the node's
// local slots with the run in one call (the same rendezvous, generations and incarnations as
// dttrainer), agree on MASTER_ADDR/MASTER_PORT through the run's store, start the user's program
// once per slot with torchrun's environment, heartbeat for the children on one stream while they
// live (client/node_heartbeats.h), report a child that fails
// (rank, exit code or signal, the exception it left) and stop the others, forward a stop signal.
// One generation per process: the local launcher or the batch script starts dtrun again when the
// coordinator restarts the run.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/coordinator_client.h"

namespace dt::run {

// dtrun's exit codes (as dttrainer's).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitStopped = 3;  // told to stop, or a child failed and that was reported

struct NodeAgentConfig {
  std::string coordinator;
  std::string tls_ca;
  std::string run_token;  // passed to the children's environment, never printed
  std::string run_id;
  std::string node;
  int nodes = 0;  // what this node expects (0: accept the run's shape)
  int procs_per_node = 1;
  // procs_per_node was counted here (--nproc-per-node gpu|cpu|auto): every registration says so,
  // and the coordinator holds the run's nodes to the first count.
  bool counts_procs_per_node = false;
  std::string master_addr;  // empty: the address this node reaches the coordinator from
  // Group rank 0's dtrun hosts the workers' TCPStore (dtrun-store; client/dtrun/agent_store.h).
  // Off by default: dtrun-store is the system LibTorch's TCPStore, and a worker importing another
  // torch (a venv's torch 2.x validates its server) may not speak to it.
  bool agent_store = false;
  std::vector<std::string> command;
  absl::Duration rendezvous_timeout = absl::Minutes(10);
  absl::Duration stop_grace = absl::Seconds(10);  // SIGTERM → SIGKILL for the children
};

// Runs one generation on this node; returns the exit code. Installs the stop-signal handler
// (BlockStopSignals() and WatchStopSignals() must have been called).
int RunNodeAgent(std::shared_ptr<CoordinatorClient> client, const NodeAgentConfig& config);

}  // namespace dt::run
