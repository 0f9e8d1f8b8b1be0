#include "client/dtrun/worker_env.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/run_env.h"

namespace dt::run {

std::string LatestCheckpointDir(const v1::RegisterResponse& a) { return a.has_resume() ? a.resume().path() : ""; }

std::map<std::string, std::string> WorkerEnvironment(const WorkerContext& c) {
  const v1::RegisterResponse& a = c.assignment;
  std::map<std::string, std::string> env = {
      // torchrun's (torch.distributed.elastic) worker environment.
      {"RANK", absl::StrCat(a.rank())},
      {"LOCAL_RANK", absl::StrCat(a.local_rank())},
      {"WORLD_SIZE", absl::StrCat(a.world_size())},
      {"LOCAL_WORLD_SIZE", absl::StrCat(a.local_world_size())},
      {"GROUP_RANK", absl::StrCat(a.node_rank())},
      {"GROUP_WORLD_SIZE", absl::StrCat(a.nodes())},
      {"ROLE_RANK", absl::StrCat(a.rank())},
      {"ROLE_WORLD_SIZE", absl::StrCat(a.world_size())},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", absl::StrCat(c.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(a.restarts())},
      {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(a.spec().max_restarts())},
      {"TORCHELASTIC_RUN_ID", a.run_id()},
      // True: every child connects to the store group rank 0's dtrun hosts (torchrun's static
      // rendezvous); False: rank 0's child hosts it (torchrun's c10d rendezvous).
      {"TORCHELASTIC_USE_AGENT_STORE", c.agent_store ? "True" : "False"},
      {"TORCHELASTIC_ERROR_FILE", c.error_file},
      // NCCL collectives fail instead of hanging when a peer dies (both spellings: torch < 2.2).
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
      // The dt module.
      {"DT_COORDINATOR", c.coordinator},
      {"DT_RUN_ID", a.run_id()},
      {"DT_RUN_TOKEN", c.run_token},
      {"DT_GENERATION", absl::StrCat(a.generation())},
      {"DT_INCARNATION", c.incarnation},
      {"DT_TIMEOUTS", a.timeouts().ShortDebugString()},
      {"DT_EXPERIMENT_DIR", a.exp_dir()},
      {"DT_LATEST_CHECKPOINT", LatestCheckpointDir(a)},
  };
  if (!c.tls_ca.empty()) env["DT_TLS_CA"] = c.tls_ca;
  if (!c.openblas_core.empty()) env["OPENBLAS_CORETYPE"] = c.openblas_core;
  const auto& run_env = a.spec().env();
  auto user_sets = [&](const std::string& name) {
    return run_env.contains(name) || (c.inherited_has && c.inherited_has(name));
  };
  if (!c.dt_python_dir.empty()) {
    std::string path = c.dt_python_dir;
    // The run's own PYTHONPATH, else dtrun's, goes after dt's directories.
    auto own_path = run_env.find("PYTHONPATH");
    const std::string& inherited_path = own_path != run_env.end() ? own_path->second : c.inherited_python_path;
    // dt's stack hook (python/dt_site/sitecustomize.py) first: Python imports the first
    // sitecustomize on its path, and the hook runs the one it shadows.
    if (!c.stacks_dir.empty()) path = absl::StrCat(c.dt_python_dir, "/dt_site:", path);
    env["PYTHONPATH"] = inherited_path.empty() ? path : absl::StrCat(path, ":", inherited_path);
  }
  if (!c.stacks_dir.empty()) env["DT_STACKS_DIR"] = c.stacks_dir;
  if (c.ptracer_pid > 0) env["DT_PTRACER"] = absl::StrCat(c.ptracer_pid);
  // torch's NCCL flight recorder (CUDA builds of torch >= 2.3): each rank keeps its recent
  // collectives and dumps them when a collective times out, here into the run's logs/, unless the
  // user chose otherwise (the variables in dtrun's own environment or the run's win).
  std::map<std::string, std::string> defaults = {
      {"TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"},
      {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"},
      {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
       absl::StrCat(a.exp_dir(), "/logs/nccl-flight-recorder-g", a.generation(), "-rank-")},
  };
  // A program that calls wandb.init itself joins the run's W&B run (a restart continues it).
  bool wandb_wanted = !a.spec().wandb().project().empty();
  for (const auto& [name, value] : run_env) wandb_wanted = wandb_wanted || absl::StartsWith(name, "WANDB_");
  if (c.inherited_wandb_settings) wandb_wanted = true;
  if (wandb_wanted) {
    WandbIdentityInput in;
    in.spec = &a.spec();
    in.exp_dir = a.exp_dir();
    in.rank = a.rank();
    in.local_rank = a.local_rank();
    in.node_rank = a.node_rank();
    defaults.merge(WandbIdentity(in));
  }
  for (auto& [name, value] : defaults) {
    if (!user_sets(name)) env[name] = value;
  }
  // torchrun's default: one thread per process when a node runs several, unless the user chose.
  if (c.inherited_omp_threads.empty() && a.local_world_size() > 1) env["OMP_NUM_THREADS"] = "1";
  // The run's own variables win over dt's defaults; dt's own names are refused at submission.
  // (Its PYTHONPATH is already behind dt's directories.)
  for (const auto& [name, value] : run_env) {
    if (name == "PYTHONPATH" && !c.dt_python_dir.empty()) continue;
    env[name] = value;
  }
  return env;
}

}  // namespace dt::run
