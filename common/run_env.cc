#include "common/run_env.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/crypto.h"
#include "common/fs.h"

namespace dt {
namespace {

// torchrun's worker identity and rendezvous, which dtrun sets for every rank.
constexpr absl::string_view kTorchrunNames[] = {"RANK",       "LOCAL_RANK",       "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",  "ROLE_WORLD_SIZE",
                                                "ROLE_NAME",  "MASTER_ADDR",      "MASTER_PORT"};

bool ValidName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::string Shown(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, 64)) out.push_back(absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?');
  return absl::StrCat("\"", out, text.size() > 64 ? "...\"" : "\"");
}

// A value in matching quotes loses them; nothing inside is interpreted.
absl::string_view Unquoted(absl::string_view v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
    return v.substr(1, v.size() - 2);
  }
  return v;
}

}  // namespace

std::string ReservedRunEnvReason(absl::string_view name) {
  for (absl::string_view n : kTorchrunNames) {
    if (name == n) return "dtrun sets it for each rank (torchrun's worker identity and rendezvous)";
  }
  if (absl::StartsWith(name, "TORCHELASTIC_")) return "dtrun sets torchrun's TORCHELASTIC_* variables";
  if (absl::StartsWith(name, "DT_")) return "DT_* variables are dt's own (the coordinator, the run and its token)";
  return "";
}

absl::Status ValidateRunEnvTotals(size_t variables, size_t bytes) {
  if (variables > static_cast<size_t>(kMaxRunEnvVars)) {
    return absl::InvalidArgumentError(
        absl::StrCat(variables, " environment variables exceed the limit of ", kMaxRunEnvVars, " a run"));
  }
  if (bytes > kMaxRunEnvBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the run's environment variables hold ", bytes, " bytes, over the limit of ", kMaxRunEnvBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateRunEnvVariable(const std::string& name, const std::string& value) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable name ", Shown(name),
                                                   " is not letters, digits and '_' (not starting with a digit)"));
  }
  if (std::string why = ReservedRunEnvReason(name); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, " cannot be set: ", why));
  }
  if (value.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "'s value contains a NUL byte"));
  }
  if (value.size() > kMaxRunEnvValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "'s value is ", value.size(),
                                                   " bytes, over the limit of ", kMaxRunEnvValueBytes));
  }
  return absl::OkStatus();
}

absl::Status ParseEnvAssignment(absl::string_view text, std::map<std::string, std::string>* env) {
  size_t eq = text.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--env ", Shown(text), " is not KEY=VALUE (write --env NAME=value, once per variable)"));
  }
  (*env)[std::string(text.substr(0, eq))] = std::string(text.substr(eq + 1));
  return absl::OkStatus();
}

absl::Status ParseEnvFile(const std::string& path, absl::string_view text, std::map<std::string, std::string>* env) {
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    absl::ConsumePrefix(&line, "export ");
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("env file ", path, " line ", number, ": ", Shown(line), " is not KEY=VALUE"));
    }
    (*env)[std::string(absl::StripAsciiWhitespace(line.substr(0, eq)))] = std::string(Unquoted(line.substr(eq + 1)));
  }
  return absl::OkStatus();
}

std::string SanitizeRunId(const std::string& text) {
  std::string out;
  for (char c : absl::AsciiStrToLower(text)) {
    bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    out.push_back(ok ? c : '-');
  }
  if (out.size() > 64) out.resize(64);
  return out.empty() ? "run" : out;
}

std::string WandbRunIdFor(v1::LogStrategy strategy, const std::string& save_dir, const std::string& experiment,
                          int rank, int node_rank) {
  switch (strategy) {
    case v1::NODE:
      return SanitizeRunId(absl::StrCat(experiment, "-node", node_rank));
    case v1::ALL:
      return SanitizeRunId(absl::StrCat(experiment, "-", rank));
    default:
      return Sha1Hex(JoinPath(save_dir, experiment));
  }
}

std::map<std::string, std::string> WandbIdentity(const WandbIdentityInput& in) {
  const v1::RunSpec& spec = *in.spec;
  const v1::WandbSettings& w = spec.wandb();
  std::map<std::string, std::string> env = {
      {"WANDB_RUN_ID",
       WandbRunIdFor(spec.log_strategy(), spec.save_dir(), spec.experiment_name(), in.rank, in.node_rank)},
      {"WANDB_RESUME", "allow"},
      {"WANDB_RUN_GROUP", w.group().empty() ? spec.experiment_name() : w.group()},
      {"WANDB_DIR", JoinPath(in.exp_dir, "wandb")},
  };
  if (!w.project().empty()) env["WANDB_PROJECT"] = w.project();
  if (!w.entity().empty()) env["WANDB_ENTITY"] = w.entity();
  if (w.tags_size() > 0) env["WANDB_TAGS"] = absl::StrJoin(w.tags(), ",");
  bool logs = spec.log_strategy() == v1::ALL || (spec.log_strategy() == v1::NODE ? in.local_rank == 0 : in.rank == 0);
  if (!logs) {
    env["WANDB_MODE"] = "disabled";
  } else if (!w.mode().empty()) {
    env["WANDB_MODE"] = w.mode();
  }
  return env;
}

}  // namespace dt
