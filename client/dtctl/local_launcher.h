// The local launcher (torchrun --standalone, with the coordinator deciding): a detached process
// that starts nodes × procs-per-node trainers on this machine, writes their output to
// <exp_dir>/logs/rank-<R>.log, tells the coordinator at once when one dies, and relaunches the
// whole group whenever the coordinator starts a new generation (its restart budget decides).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dt::ctl {

struct LocalLaunch {
  std::string coordinator;
  std::string tls_ca;
  std::string run_id;
  std::string run_token;  // passed in the environment, never on a command line
  std::string trainer;
  std::string exp_dir;
  int nodes = 1;
  int procs_per_node = 1;
  int omp_threads = 0;  // 0: cores / (nodes × procs), at least 1 (unless OMP_NUM_THREADS is set)
  std::vector<std::string> trainer_args;
  // The user's program: one `dtrun` per node starts it once per slot, instead of dttrainers.
  std::vector<std::string> exec_command;
  // OPENBLAS_CORETYPE for every process started (common/blas_core.h); empty: OpenBLAS's own pick.
  std::string openblas_core;
  // The run's variables (RunSpec.env) for every dttrainer; dtrun gives them to its ranks itself.
  std::map<std::string, std::string> env;
  // The nodes the generation forms on (Run.generation_nodes: an elastic run that lost a node);
  // empty: all `nodes`.
  std::vector<std::string> only_nodes;
};

// One process the launcher starts for a generation: a dttrainer per rank, or a dtrun per node.
struct LaunchUnit {
  int node = 0;
  int slot = -1;  // -1: a node agent (dtrun) for all of the node's slots
  int rank = -1;  // the trainer's rank (ranks are contiguous per node); -1 for dtrun
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to the launcher's; holds the run token
  std::string log_file;
};

// What a generation of `launch` starts (also what `dtctl submit --dry-run` prints): on every node,
// or on `only_nodes`, which then count as the run's nodes (--nnodes) and take its ranks in order.
std::vector<LaunchUnit> LaunchUnits(const LocalLaunch& launch);

// The node name of simulated node `node` of a local run: the real node name for one node; for
// several on one machine, "<host>-node<k>" (natural name order = node order).
std::string LocalNodeName(int nodes, int node);
// OMP_NUM_THREADS per trainer: `requested` if positive, else $OMP_NUM_THREADS, else cores / trainers.
int LocalThreads(int requested, int trainers);

// Starts `dtctl __launch-local` detached (own session, output to <exp_dir>/logs/launcher.log);
// returns its pid.
absl::StatusOr<int> StartLocalLauncher(const LocalLaunch& launch);

// The launcher's main loop (runs inside the detached process). Returns its exit code: 0 when the
// run succeeded.
int RunLocalLauncher(const LocalLaunch& launch);

}  // namespace dt::ctl
