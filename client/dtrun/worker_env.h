// The environment dtrun gives each child: what torchrun gives its workers (so a script written for
// torchrun runs unchanged, `init_process_group("env://")` included) plus what the dt module reads.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "dt/v1/rendezvous.pb.h"

namespace dt::run {

struct WorkerContext {
  v1::RegisterResponse assignment;  // this slot's rank, the world, the generation, the spec
  std::string incarnation;          // the registration the child acts for (dt module)
  std::string master_addr;          // group rank 0's node, as the other nodes reach it
  int master_port = 0;
  bool agent_store = false;  // dtrun hosts the TCPStore at MASTER_ADDR:MASTER_PORT
  std::string coordinator;
  std::string tls_ca;
  std::string run_token;   // in the environment only, never printed
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  // The value of OMP_NUM_THREADS in dtrun's own environment; empty when unset.
  std::string inherited_omp_threads;
  // The dt Python package's directory (empty: none found) and dtrun's own PYTHONPATH: the
  // package goes first, so `import dt` works without installing it.
  std::string dt_python_dir;
  std::string inherited_python_path;
  // OPENBLAS_CORETYPE for the children (common/blas_core.h); empty: OpenBLAS's own pick.
  std::string openblas_core;
  // Where the child's Python processes register for stack captures (DT_STACKS_DIR; empty: none):
  // the hook's directory (<dt_python_dir>/dt_site) then goes first on PYTHONPATH.
  std::string stacks_dir;
  int ptracer_pid = 0;  // DT_PTRACER: the process that captures (dtrun), for Yama's ptrace_scope 1
  // Whether dtrun's own environment sets a variable: the user's choice, which dt's defaults
  // (the NCCL flight recorder, the W&B identity) leave alone. Unset: nothing is inherited.
  std::function<bool(const std::string&)> inherited_has;
  // dtrun's own environment has WANDB_* settings (the user logs to W&B from the program).
  bool inherited_wandb_settings = false;
};

// Variables added to (or overriding) the child's inherited environment: torchrun's, the dt
// module's, the run's own (RunSpec.env, over dt's defaults), and, when the run names a W&B
// project or the user's environment has WANDB_* settings, the W&B identity (common/run_env.h).
std::map<std::string, std::string> WorkerEnvironment(const WorkerContext& context);

// The latest committed checkpoint's directory (empty when there is none).
std::string LatestCheckpointDir(const v1::RegisterResponse& assignment);

}  // namespace dt::run
