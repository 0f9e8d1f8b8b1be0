#include "client/join_run.h"

#include "absl/strings/str_cat.h"
#include "common/env.h"

namespace dt {

absl::StatusOr<std::string> CreateOrJoinRun(CoordinatorClient& client, const JoinRunSpec& join) {
  std::string job = Env("SLURM_JOB_ID");
  v1::SubmitRunRequest req;
  v1::RunSpec* spec = req.mutable_spec();
  spec->set_experiment_name(join.experiment_name);
  spec->set_save_dir(join.save_dir);
  spec->set_nodes(join.nodes);
  spec->set_procs_per_node(join.procs_per_node);
  spec->set_procs_per_node_rule(join.procs_per_node_rule);
  spec->set_scheduler(v1::EXTERNAL);
  spec->set_max_restarts(join.max_restarts);
  spec->set_join_key(absl::StrCat(join.experiment_name, "@slurm-", job.empty() ? "none" : job));
  for (const auto& arg : join.trainer_args) spec->add_trainer_args(arg);
  for (const auto& arg : join.exec_command) spec->add_exec_command(arg);
  absl::StatusOr<v1::SubmitRunResponse> run =
      Call(client, &v1::RunService::Stub::SubmitRun, client.runs(), req, absl::Seconds(30));
  if (!run.ok()) return run.status();
  return run->run_id();
}

}  // namespace dt
