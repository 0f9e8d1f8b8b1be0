// The variables a user gives every rank of a run (`dtctl submit --env KEY=VALUE`, `--env-file`,
// a run file's `env:`), and the W&B identity dtrun gives programs that call wandb.init themselves.
// One set of rules for dtctl (which refuses early) and the coordinator (which refuses always).
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dt/v1/common.pb.h"

namespace dt {

// Bounds on a run's variables: they ride in the run spec (SQLite, run.json, every RegisterResponse).
inline constexpr int kMaxRunEnvVars = 256;
inline constexpr size_t kMaxRunEnvValueBytes = 32 << 10;  // 32 KiB
inline constexpr size_t kMaxRunEnvBytes = 256 << 10;      // names and values together

// Why dt sets `name` itself, or empty when the user may set it. dt owns a rank's identity and
// rendezvous (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, ..., TORCHELASTIC_*) and the dt module's
// connection (DT_*): a user's value would make ranks disagree about who they are.
std::string ReservedRunEnvReason(absl::string_view name);

// OK, or INVALID_ARGUMENT naming the variable and the rule: a name of letters, digits and '_' not
// starting with a digit, not one dt sets, no NUL in a value, and the bounds above.
absl::Status ValidateRunEnvVariable(const std::string& name, const std::string& value);
absl::Status ValidateRunEnvTotals(size_t variables, size_t bytes);
// The whole set (a std::map in dtctl, the spec's map in the coordinator).
template <typename Map>
absl::Status ValidateRunEnv(const Map& env) {
  size_t bytes = 0;
  for (const auto& [name, value] : env) bytes += name.size() + value.size();
  if (absl::Status s = ValidateRunEnvTotals(env.size(), bytes); !s.ok()) return s;
  for (const auto& [name, value] : env) {
    if (absl::Status s = ValidateRunEnvVariable(name, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// "KEY=VALUE" into `env` (a later KEY replaces an earlier one). INVALID_ARGUMENT without '='.
absl::Status ParseEnvAssignment(absl::string_view text, std::map<std::string, std::string>* env);

// An env file's lines into `env`: KEY=VALUE (an optional leading "export "), blank lines and
// '#' comments skipped, a value in matching single or double quotes taken without them (no
// escapes, no expansion). INVALID_ARGUMENT names `path` and the line.
absl::Status ParseEnvFile(const std::string& path, absl::string_view text, std::map<std::string, std::string>* env);

// A W&B run id from free text: lower-case, [a-z0-9_-], at most 64 characters.
std::string SanitizeRunId(const std::string& text);

// The W&B run id dt uses for a rank's points under `strategy`: main, the SHA-1 of the experiment
// dir (so a restart or a requeue continues the same W&B run); node, "<experiment>-node<N>"; all,
// "<experiment>-<R>". The forwarder and dtrun's WANDB_RUN_ID both come from here.
std::string WandbRunIdFor(v1::LogStrategy strategy, const std::string& save_dir, const std::string& experiment,
                          int rank, int node_rank);

struct WandbIdentityInput {
  const v1::RunSpec* spec = nullptr;
  std::string exp_dir;
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
};

// The WANDB_* variables a rank's program gets so that its own wandb.init() joins the right W&B run
// with no code change (the table is in docs/guide/your-own-script.md): WANDB_RUN_ID, WANDB_RESUME=allow,
// WANDB_RUN_GROUP (the experiment), WANDB_PROJECT/WANDB_ENTITY/WANDB_TAGS as submitted,
// WANDB_DIR (<exp dir>/wandb), and WANDB_MODE=disabled on ranks that do not log under the
// strategy (main: ranks other than 0; node: local ranks other than 0). A variable the user sets
// is left to the user (the caller leaves out what the user set). Never the API key: that is the user's own environment
// or netrc.
std::map<std::string, std::string> WandbIdentity(const WandbIdentityInput& in);

}  // namespace dt
