#include "client/dtctl/submit.h"

#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/agent.h"
#include "client/dtctl/local_launcher.h"
#include "client/dtctl/slurm.h"
#include "common/crypto.h"
#include "common/data_dir.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/limits.h"
#include "common/names.h"
#include "common/procs_per_node.h"
#include "common/run_env.h"
#include "common/subprocess.h"
#include "common/utf8.h"

namespace dt::ctl {
namespace {

// The value of `--flag VALUE` or `--flag=VALUE` among trainer arguments: the last one given, as
// dttrainer takes it.
std::optional<std::string> TrainerFlag(const std::vector<std::string>& args, const std::string& flag) {
  std::optional<std::string> value;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) value = args[i + 1];
    if (absl::StartsWith(args[i], flag + "=")) value = args[i].substr(flag.size() + 1);
  }
  return value;
}

std::string AbsolutePath(const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return p;
  return JoinPath(cwd, p);
}

// The --exec program runs, and so does the dtrun that starts it (beside dtctl).
absl::Status PreflightExec(const std::vector<std::string>& command) {
  if (absl::Status s = CheckExecutable(command.front()); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--exec: ", s.message()));
  }
  std::string dtrun = JoinPath(ExecutableDir(), "dtrun");
  if (::access(dtrun.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--exec needs dtrun beside dtctl, and ", dtrun, " is missing: reinstall dt"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Reads a run file's fields, each with its type and range: a message names the file, the line,
// the field and what it should hold.
class RunFileReader {
 public:
  explicit RunFileReader(std::string path) : path_(std::move(path)) {}

  absl::Status Error(const YAML::Node& node, const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("run file ", path_, " line ", node.Mark().line + 1, ": ", field, " ", what));
  }

  absl::Status Text(const YAML::Node& doc, const std::string& field, std::string* out) const {
    const YAML::Node n = doc[field];
    if (!n) return absl::OkStatus();
    if (!n.IsScalar()) return Error(n, field, "must be a single value, e.g. " + field + ": value");
    *out = n.Scalar();
    return absl::OkStatus();
  }

  absl::Status Number(const YAML::Node& doc, const std::string& field, int64_t min, int64_t max, int* out) const {
    const YAML::Node n = doc[field];
    if (!n) return absl::OkStatus();
    int64_t value = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &value)) {
      return Error(n, field, absl::StrCat("must be a whole number, got ", Describe(n)));
    }
    if (value < min || value > max)
      return Error(n, field, absl::StrCat("must be in ", min, "..", max, ", got ", value));
    *out = static_cast<int>(value);
    return absl::OkStatus();
  }

  absl::Status List(const YAML::Node& doc, const std::string& field, std::vector<std::string>* out) const {
    const YAML::Node n = doc[field];
    if (!n) return absl::OkStatus();
    if (!n.IsSequence()) {
      return Error(n, field, "must be a list, e.g. " + field + ": [--dataset, data.json] (one word per item)");
    }
    out->clear();
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) return Error(item, field, "must hold single words, not lists or mappings");
      out->push_back(item.Scalar());
    }
    return absl::OkStatus();
  }

  absl::Status Mapping(const YAML::Node& doc, const std::string& field, std::map<std::string, std::string>* out) const {
    const YAML::Node n = doc[field];
    if (!n) return absl::OkStatus();
    if (!n.IsMap()) return Error(n, field, "must be a mapping, e.g. " + field + ": {NAME: value}");
    for (const auto& kv : n) {
      if (!kv.first.IsScalar() || !kv.second.IsScalar()) {
        return Error(kv.first, field, "must map names to single values, not lists or mappings");
      }
      (*out)[kv.first.Scalar()] = kv.second.Scalar();
    }
    return absl::OkStatus();
  }

  // Every key of `map` is one of `known`.
  absl::Status KnownKeys(const YAML::Node& map, const std::string& where, const std::vector<std::string>& known) const {
    for (const auto& kv : map) {
      std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return Error(kv.first, where,
                     absl::StrCat("has an unknown field \"", PrintableForTerminal(key),
                                  "\" (known: ", absl::StrJoin(known, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

 private:
  static std::string Describe(const YAML::Node& n) {
    if (n.IsScalar()) return absl::StrCat("\"", PrintableForTerminal(n.Scalar()), "\"");
    return n.IsSequence() ? "a list" : "a mapping";
  }
  std::string path_;
};

// The text: YAML, a mapping.
absl::StatusOr<YAML::Node> ParseRunFileDocument(const std::string& path, const std::string& text) {
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("run file ", path, " is not valid YAML: ", PrintableForTerminal(e.what())));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("run file ", path, " cannot be read: ", PrintableForTerminal(e.what())));
  }
  if (!doc.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat("run file ", path, " must be a YAML mapping (field: value lines)"));
  }
  return doc;
}

}  // namespace

absl::Status LoadRunFile(const std::string& path, SubmitOptions* options) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("run file ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("run file ", path, " is not a regular file; give a YAML file (-f run.yaml)"));
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("run file ", path, " cannot be read: ", text.status().message()));
  }
  return ParseRunFile(path, *text, options);
}

absl::Status ParseRunFile(const std::string& path, const std::string& text, SubmitOptions* o) {
  absl::StatusOr<YAML::Node> loaded = ParseRunFileDocument(path, text);
  if (!loaded.ok()) return loaded.status();
  const YAML::Node& doc = *loaded;
  RunFileReader r(path);
  static const std::vector<std::string> known = {
      "name",         "save_dir",      "nodes",        "nproc_per_node",      "scheduler",
      "log_strategy", "wandb",         "max_restarts", "keep_checkpoints",    "gpus_per_node",
      "omp_threads",  "sbatch_args",   "trainer",      "trainer_args",        "exec",
      "max_requeues", "preempt_grace", "idle_timeout", "max_identical_hangs", "env"};
  // The same ranges as the flags (and the coordinator's limits).
  std::vector<absl::Status> checks = {
      r.KnownKeys(doc, "the run file", known),
      r.Text(doc, "name", &o->name),
      r.Text(doc, "save_dir", &o->save_dir),
      r.Text(doc, "scheduler", &o->scheduler),
      r.Text(doc, "log_strategy", &o->log_strategy),
      r.Number(doc, "max_restarts", 0, kMaxPolicyCount, &o->max_restarts),
      r.Number(doc, "keep_checkpoints", 1, kMaxPolicyCount, &o->keep_checkpoints),
      r.Number(doc, "max_requeues", 0, kMaxPolicyCount, &o->max_requeues),
      r.Number(doc, "preempt_grace", 10, 86400, &o->preempt_grace_s),
      r.Number(doc, "gpus_per_node", 0, 1024, &o->gpus_per_node),
      r.Number(doc, "omp_threads", 1, 1024, &o->omp_threads),
      r.Text(doc, "trainer", &o->trainer),
      r.List(doc, "sbatch_args", &o->sbatch_args),
      r.List(doc, "trainer_args", &o->trainer_args),
      r.List(doc, "exec", &o->exec_command),
      r.Text(doc, "idle_timeout", &o->idle_timeout),
      r.Number(doc, "max_identical_hangs", 1, kMaxPolicyCount, &o->max_identical_hangs),
  };
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  if (absl::Status s = r.Mapping(doc, "env", &o->env); !s.ok()) return s;
  if (const YAML::Node n = doc["nodes"]) {
    absl::StatusOr<NodeRange> parsed =
        n.IsScalar() ? ParseNodeRange(n.Scalar()) : absl::InvalidArgumentError("must be a count or MIN:MAX");
    if (!parsed.ok()) return r.Error(n, "nodes", std::string(parsed.status().message()));
    o->nodes = parsed->max;
    o->min_nodes = parsed->min;
  }
  if (const YAML::Node n = doc["nproc_per_node"]) {
    absl::StatusOr<ProcsPerNode> parsed =
        n.IsScalar() ? ParseProcsPerNode(n.Scalar(), "value") : absl::InvalidArgumentError("must be a single value");
    if (!parsed.ok()) return r.Error(n, "nproc_per_node", std::string(parsed.status().message()));
    o->nproc_per_node = parsed->count;
    o->nproc_rule = parsed->rule;
  }
  if (const YAML::Node w = doc["wandb"]) {
    if (!w.IsMap()) return r.Error(w, "wandb", "must be a mapping (project:, entity:, mode:, tags:)");
    for (absl::Status s : {r.KnownKeys(w, "wandb", {"project", "entity", "mode", "tags"}),
                           r.Text(w, "project", &o->wandb_project), r.Text(w, "entity", &o->wandb_entity),
                           r.Text(w, "mode", &o->wandb_mode), r.List(w, "tags", &o->wandb_tags)}) {
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

void AbsolutizeTrainerPaths(SubmitOptions* o) {
  if (!o->exec_command.empty()) {
    std::string& program = o->exec_command.front();
    if (program.find('/') != std::string::npos) program = AbsolutePath(program);
    return;
  }
  // Trainers start elsewhere (a Slurm node, the launcher's directory): make data paths absolute.
  auto& args = o->trainer_args;
  for (size_t i = 0; i < args.size(); ++i) {
    for (const char* flag : {"--dataset", "--tokenizer-dir"}) {
      std::string f = flag;
      if (args[i] == f && i + 1 < args.size()) {
        args[i + 1] = AbsolutePath(args[i + 1]);
      } else if (absl::StartsWith(args[i], f + "=")) {
        args[i] = f + "=" + AbsolutePath(args[i].substr(f.size() + 1));
      }
    }
  }
  o->trainer = o->trainer.find('/') == std::string::npos ? o->trainer : AbsolutePath(o->trainer);
  // Without --tokenizer-dir the trainers use the GPT-2 files shipped in dt's data/: name that
  // directory explicitly, so the pre-flight checks it and every node reads the same one.
  if (!TrainerFlag(args, "--tokenizer-dir")) {
    if (std::optional<std::string> shipped = FindDefaultTokenizerDir()) {
      args.push_back("--tokenizer-dir");
      args.push_back(*shipped);
    }
  }
}

absl::Status CountProcsPerNode(SubmitOptions* o) {
  if (o->nproc_rule.empty()) return absl::OkStatus();
  if (o->scheduler != "slurm") {
    absl::StatusOr<int> count = ResolveProcsPerNode({0, o->nproc_rule}, ProbeThisNode(), HostName());
    if (!count.ok()) return count.status();
    o->nproc_per_node = *count;
    return absl::OkStatus();
  }
  if (o->exec_command.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nproc-per-node ", o->nproc_rule,
        " on Slurm needs --exec (dtrun counts it on each node); srun starts a fixed number of dttrainers per "
        "node: give a count"));
  }
  o->nproc_per_node = 0;
  return absl::OkStatus();
}

absl::StatusOr<NodeRange> ParseNodeRange(const std::string& text) {
  auto count = [](absl::string_view word, int* out) {
    return absl::SimpleAtoi(word, out) && *out >= 1 && *out <= kMaxWorldSize;
  };
  NodeRange range;
  size_t colon = text.find(':');
  if (colon == std::string::npos) {
    if (!count(text, &range.max)) {
      return absl::InvalidArgumentError(absl::StrCat("\"", PrintableForTerminal(text), "\" is not a node count in 1..",
                                                     kMaxWorldSize, " or MIN:MAX"));
    }
    return range;
  }
  absl::string_view all(text);
  if (!count(all.substr(0, colon), &range.min) || !count(all.substr(colon + 1), &range.max)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", PrintableForTerminal(text), "\" is not MIN:MAX with two node counts in 1..", kMaxWorldSize));
  }
  if (range.min >= range.max) {
    return absl::InvalidArgumentError(
        absl::StrCat("MIN:MAX ", range.min, ":", range.max,
                     " needs MIN below MAX (the run starts at MAX nodes and "
                     "goes on with no fewer than MIN); for a fixed size give one count, e.g. --nodes ",
                     range.max));
  }
  return range;
}

absl::Status CheckElasticGlobalBatch(const SubmitOptions& o) {
  if (o.min_nodes <= 0 || !o.exec_command.empty() || o.nproc_per_node < 1) return absl::OkStatus();
  std::optional<std::string> global_text = TrainerFlag(o.trainer_args, "--global-batch-size");
  if (!global_text) return absl::OkStatus();
  int64_t global = 0;
  int batch = 8;  // dttrainer's default --batch-size
  std::optional<std::string> batch_text = TrainerFlag(o.trainer_args, "--batch-size");
  // dttrainer refuses malformed values itself, naming them.
  if (!absl::SimpleAtoi(*global_text, &global) || (batch_text && !absl::SimpleAtoi(*batch_text, &batch)) || batch < 1 ||
      global < 1) {
    return absl::OkStatus();
  }
  for (int nodes = o.min_nodes; nodes <= o.nodes; ++nodes) {
    int64_t micro = static_cast<int64_t>(batch) * nodes * o.nproc_per_node;
    if (global % micro == 0) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch-size ", global, " does not divide at ", nodes, " node(s) of --nodes ", o.min_nodes,
                     ":", o.nodes, ": --batch-size ", batch, " x ", nodes * o.nproc_per_node, " rank(s) = ", micro,
                     ", and ", global, " / ", micro,
                     " is not whole (global batch = batch x accumulation x world); choose a global batch that every "
                     "world size from ",
                     o.min_nodes * o.nproc_per_node, " to ", o.nodes * o.nproc_per_node,
                     " rank(s) divides with the batch size, or narrow MIN:MAX"));
  }
  return absl::OkStatus();
}

absl::Status Preflight(const SubmitOptions& o) {
  if (absl::Status s = ValidateExperimentName(o.name); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--name: ", s.message()));
  }
  if (o.save_dir.empty())
    return absl::InvalidArgumentError("--save-dir is required (where the experiment directory goes)");
  if (absl::Status s = ValidateRunEnv(o.env); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--env: ", s.message()));
  }
  if (o.nodes < 1 || (o.nproc_per_node < 1 && o.nproc_rule.empty())) {
    return absl::InvalidArgumentError("--nodes and --nproc-per-node must be at least 1");
  }
  if (o.scheduler != "local" && o.scheduler != "slurm") {
    return absl::InvalidArgumentError(absl::StrCat("--scheduler \"", o.scheduler, "\" is not local or slurm"));
  }
  if (o.log_strategy != "main" && o.log_strategy != "node" && o.log_strategy != "all") {
    return absl::InvalidArgumentError(absl::StrCat("--log-strategy \"", o.log_strategy, "\" is not main, node or all"));
  }
  if (!o.exec_command.empty() && !o.trainer_args.empty()) {
    return absl::InvalidArgumentError(
        "a run file's trainer_args and exec cannot both be given (exec runs your own program)");
  }
  if (absl::Status s = CheckElasticGlobalBatch(o); !s.ok()) return s;
  if (o.scheduler == "slurm" && FindOnPath("sbatch").empty()) {
    return absl::FailedPreconditionError("--scheduler slurm: sbatch is not on PATH (is this a Slurm login node?)");
  }
  if (!o.exec_command.empty()) {
    if (absl::Status s = PreflightExec(o.exec_command); !s.ok()) return s;
  }
  // The save dir: creatable and writable from here (a shared file system is assumed).
  if (absl::Status s = MakeDirs(o.save_dir); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("save dir: ", s.message(), "; choose a writable --save-dir"));
  }
  if (!IsWritableDir(o.save_dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("save dir ", o.save_dir, " is not writable; choose another --save-dir"));
  }
  if (!o.exec_command.empty()) return absl::OkStatus();
  // The data the trainers will read.
  std::optional<std::string> dataset = TrainerFlag(o.trainer_args, "--dataset");
  if (!dataset) return absl::InvalidArgumentError("the trainer arguments need --dataset PATH (after --)");
  struct stat st;
  if (::stat(dataset->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("dataset ", *dataset, " does not exist or is not a file"));
  }
  std::optional<std::string> tokenizer = TrainerFlag(o.trainer_args, "--tokenizer-dir");
  if (!tokenizer) {
    return absl::InvalidArgumentError(
        "the trainer arguments need --tokenizer-dir DIR (after --): no GPT-2 tokenizer files were found in "
        "dt's data/ folder beside dtctl or in its source tree");
  }
  bool gpt2_files = ::access(JoinPath(*tokenizer, "encoder.json").c_str(), R_OK) == 0 &&
                    ::access(JoinPath(*tokenizer, "vocab.bpe").c_str(), R_OK) == 0;
  bool hf_files = ::access(JoinPath(*tokenizer, "vocab.json").c_str(), R_OK) == 0 &&
                  ::access(JoinPath(*tokenizer, "merges.txt").c_str(), R_OK) == 0;
  if (!gpt2_files && !hf_files) {
    return absl::FailedPreconditionError(
        absl::StrCat("tokenizer dir ", *tokenizer, " lacks encoder.json + vocab.bpe (or vocab.json + merges.txt)"));
  }
  // The trainer binary runs. Loading LibTorch takes a moment: remember a binary that ran (by
  // path, size and time) so repeated submits skip it.
  struct stat tst;
  std::string fingerprint;
  std::string cache;
  if (::stat(o.trainer.c_str(), &tst) == 0) {
    fingerprint = absl::StrCat(o.trainer, ":", tst.st_size, ":", tst.st_mtim.tv_sec, ".", tst.st_mtim.tv_nsec);
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::string base = xdg != nullptr && *xdg != '\0' ? xdg : JoinPath(home != nullptr ? home : "/tmp", ".cache");
    cache = JoinPath(JoinPath(base, "dt"), absl::StrCat("trainer-ok-", Sha256Hex(fingerprint).substr(0, 16)));
  }
  if (cache.empty() || ReadFile(cache).value_or("") != fingerprint) {
    absl::StatusOr<CommandResult> version = RunCommand({o.trainer, "--version"}, absl::Seconds(20));
    if (!version.ok() || version->exit_code != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the trainer ", o.trainer, " does not run (",
          version.ok() ? absl::StrCat("exit ", version->exit_code, ": ", version->output) : version.status().ToString(),
          "); pass --trainer PATH"));
    }
    if (!cache.empty() && MakeDirs(Dirname(cache)).ok()) (void)WriteFileAtomic(cache, fingerprint);
  }
  return absl::OkStatus();
}

namespace {

// What a launch needs beside the options; for a dry run, placeholders.
struct LaunchIdentity {
  std::string coordinator;
  std::string tls_ca;
  std::string run_id;
  std::string run_token;
  std::string exp_dir;
};

// One builder each for the local launcher and the sbatch script: a dry run describes exactly what
// a real launch starts.
LocalLaunch LocalLaunchFor(const SubmitOptions& o, const LaunchIdentity& id) {
  LocalLaunch l;
  l.coordinator = id.coordinator;
  l.tls_ca = id.tls_ca;
  l.run_id = id.run_id;
  l.run_token = id.run_token;
  l.trainer = o.trainer;
  l.exp_dir = id.exp_dir;
  l.nodes = o.nodes;
  l.procs_per_node = o.nproc_per_node;
  l.omp_threads = o.omp_threads;
  l.trainer_args = o.trainer_args;
  l.exec_command = o.exec_command;
  l.env = o.env;
  return l;
}

SbatchParams SbatchParamsFor(const SubmitOptions& o, const LaunchIdentity& id) {
  SbatchParams p;
  p.job_name = absl::StrCat("dt-", o.name);
  p.nodes = o.nodes;
  p.min_nodes = o.min_nodes;
  p.tasks_per_node = o.nproc_per_node;
  p.gpus_per_node = o.gpus_per_node;
  p.logs_dir = JoinPath(id.exp_dir, "logs");
  p.exp_dir = id.exp_dir;
  p.sbatch_args = o.sbatch_args;
  p.coordinator = id.coordinator;
  p.run_id = id.run_id;
  p.run_token = id.run_token;
  p.tls_ca = id.tls_ca;
  p.omp_threads = o.omp_threads > 0 ? o.omp_threads : 1;
  p.trainer = o.trainer;
  p.trainer_args = o.trainer_args;
  p.dtctl = JoinPath(ExecutableDir(), "dtctl");
  p.preempt_grace_s = o.preempt_grace_s;
  p.trainer_env = o.env;
  if (!o.exec_command.empty()) {
    p.trainer_env.clear();  // dtrun gives the run's variables to its ranks
    // One dtrun per node starts the node's ranks.
    p.tasks_per_node = 1;
    p.cpus_per_task = o.nproc_per_node;  // 0 (a rule counted on the nodes): Slurm's default
    p.omp_threads = o.omp_threads;
    p.trainer = JoinPath(ExecutableDir(), "dtrun");
    p.pass_step_nodes = true;  // the step's node count: smaller in a shrunk elastic generation
    p.trainer_args = {"--nproc-per-node", o.nproc_per_node > 0 ? absl::StrCat(o.nproc_per_node) : o.nproc_rule, "--"};
    p.trainer_args.insert(p.trainer_args.end(), o.exec_command.begin(), o.exec_command.end());
  }
  return p;
}

}  // namespace

absl::StatusOr<std::string> DescribeLaunch(const SubmitOptions& o, const std::string& coordinator) {
  LaunchIdentity id{coordinator, "", "<run id>", "<run token>", JoinPath(AbsolutePath(o.save_dir), o.name)};
  if (o.scheduler == "slurm") {
    absl::StatusOr<std::string> tmpl = FindSbatchTemplate();
    if (!tmpl.ok()) return tmpl.status();
    return RenderSbatch(*tmpl, SbatchParamsFor(o, id));
  }
  std::string out;
  for (const LaunchUnit& u : LaunchUnits(LocalLaunchFor(o, id))) {
    for (const auto& [k, v] : u.env) absl::StrAppend(&out, k, "=", ShellQuote(v), " ");
    for (const auto& a : u.argv) absl::StrAppend(&out, ShellQuote(a), " ");
    absl::StrAppend(&out, ">> ", ShellQuote(u.log_file), " 2>&1\n");
  }
  return out;
}

absl::StatusOr<absl::Duration> ParseIdleTimeout(const std::string& text) {
  if (text == "0" || text == "off") return absl::ZeroDuration();
  absl::StatusOr<absl::Duration> d = ParsePositiveDuration("--idle-timeout", text);
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(d.status().message(), ", or 0 to turn the check off"));
  if (*d > kMaxIdleTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--idle-timeout ", text, " is longer than ", absl::FormatDuration(kMaxIdleTimeout)));
  }
  return *d;
}

namespace {

// Slurm declares a silent node dead after its SlurmdTimeout and then ends the step on every node
// (srun --no-kill keeps the job, not the step). dt must have gone on without the node before that
// (its heartbeat timeout, then up to two heartbeats to stop the generation), or an elastic run
// loses every rank instead of shrinking, and a lost batch host's job holds its nodes with no rank
// left to requeue or cancel it. Said at submit, before the job is queued.
void WarnIfSlurmEndsTheStepFirst(const SubmitOptions& o, const v1::TimeoutPolicy& timeouts) {
  if (timeouts.heartbeat_timeout_ms() <= 0) return;  // an older coordinator does not say
  absl::StatusOr<absl::Duration> slurmd = SlurmdTimeout();
  if (!slurmd.ok()) return;
  const absl::Duration timeout = absl::Milliseconds(timeouts.heartbeat_timeout_ms());
  const absl::Duration beats = 2 * absl::Milliseconds(timeouts.heartbeat_interval_ms());
  if (*slurmd > timeout + beats) return;
  std::cerr << "dtctl: warning: Slurm declares a silent node dead after its SlurmdTimeout ("
            << absl::FormatDuration(*slurmd) << ") and then ends the job's step on every node, before dt goes on "
            << "without the node (the coordinator's heartbeat timeout, " << absl::FormatDuration(timeout)
            << ", and two heartbeats). A node this elastic run (--nodes " << o.min_nodes << ":" << o.nodes
            << ") loses would end every rank instead of shrinking the run. "
            << (*slurmd - beats > 2 * beats ? absl::StrCat("Start dtcoord with a --heartbeat-timeout under ",
                                                           absl::FormatDuration(*slurmd - beats), ", or raise ")
                                            : "Raise ")
            << "SlurmdTimeout in slurm.conf\n";
}

}  // namespace

absl::StatusOr<Submitted> SubmitAndLaunch(const std::shared_ptr<CoordinatorClient>& client, const SubmitOptions& o,
                                          const std::string& tls_ca) {
  v1::SubmitRunRequest req;
  v1::RunSpec* spec = req.mutable_spec();
  spec->set_experiment_name(o.name);
  spec->set_save_dir(AbsolutePath(o.save_dir));
  spec->set_nodes(o.nodes);
  spec->set_min_nodes(o.min_nodes);
  spec->set_procs_per_node(o.nproc_per_node);
  spec->set_procs_per_node_rule(o.nproc_rule);
  spec->set_scheduler(o.scheduler == "slurm" ? v1::SLURM : v1::LOCAL);
  spec->set_log_strategy(o.log_strategy == "all" ? v1::ALL : o.log_strategy == "node" ? v1::NODE : v1::MAIN);
  spec->set_max_restarts(o.max_restarts);
  spec->set_keep_checkpoints(o.keep_checkpoints);
  spec->set_max_requeues(o.scheduler == "slurm" ? o.max_requeues : 0);
  if (o.exec_command.empty()) spec->set_trainer_path(o.trainer);
  for (const auto& a : o.trainer_args) spec->add_trainer_args(a);
  for (const auto& a : o.exec_command) spec->add_exec_command(a);
  for (const auto& a : o.sbatch_args) spec->add_sbatch_args(a);
  spec->mutable_wandb()->set_project(o.wandb_project);
  spec->mutable_wandb()->set_entity(o.wandb_entity);
  spec->mutable_wandb()->set_mode(o.wandb_mode);
  for (const auto& t : o.wandb_tags) spec->mutable_wandb()->add_tags(t);
  spec->mutable_env()->insert(o.env.begin(), o.env.end());
  if (!o.idle_timeout.empty()) {
    absl::StatusOr<absl::Duration> idle = ParseIdleTimeout(o.idle_timeout);
    if (!idle.ok()) return idle.status();
    spec->set_idle_timeout_ms(absl::ToInt64Milliseconds(*idle));
  }
  if (o.max_identical_hangs > 0) spec->set_max_identical_hangs(o.max_identical_hangs);
  absl::StatusOr<v1::SubmitRunResponse> run =
      Call(*client, &v1::RunService::Stub::SubmitRun, client->runs(), req, absl::Seconds(30));
  if (!run.ok()) return run.status();

  Submitted out;
  out.run_id = run->run_id();
  out.exp_dir = run->exp_dir();
  out.resume_step = run->resume_step();
  std::string logs = JoinPath(run->exp_dir(), "logs");
  auto fail_run = [&](const absl::Status& why) {
    v1::CancelRunRequest cancel;
    cancel.set_run_id(out.run_id);
    cancel.set_reason(absl::StrCat("launch failed: ", why.message()));
    (void)Call(*client, &v1::RunService::Stub::CancelRun, client->runs(), cancel, absl::Seconds(10));
    return why;
  };
  LaunchIdentity id{client->address(), tls_ca, out.run_id, run->run_token(), run->exp_dir()};
  if (o.scheduler == "local") {
    absl::StatusOr<int> pid = StartLocalLauncher(LocalLaunchFor(o, id));
    if (!pid.ok()) return fail_run(pid.status());
    out.job_id = absl::StrCat("local:", *pid);
  } else {
    absl::StatusOr<std::string> tmpl = FindSbatchTemplate();
    if (!tmpl.ok()) return fail_run(tmpl.status());
    absl::StatusOr<std::string> script = RenderSbatch(*tmpl, SbatchParamsFor(o, id));
    if (!script.ok()) return fail_run(script.status());
    std::string path = JoinPath(logs, absl::StrCat(out.run_id, ".sbatch"));
    if (absl::Status s = WriteFileAtomic(path, *script, 0600); !s.ok()) return fail_run(s);
    if (o.min_nodes > 0) WarnIfSlurmEndsTheStepFirst(o, run->timeouts());
    absl::StatusOr<std::string> job = SubmitBatch(path);
    if (!job.ok()) return fail_run(job.status());
    out.job_id = *job;
  }
  v1::AttachLaunchRequest attach;
  attach.set_run_id(out.run_id);
  attach.set_scheduler_job_id(out.job_id);
  attach.set_launcher_host(HostName());
  absl::StatusOr<v1::Run> attached =
      Call(*client, &v1::RunService::Stub::AttachLaunch, client->runs(), attach, absl::Seconds(10));
  if (!attached.ok()) {
    // The run is launched: say so, and still give its id (a retry would start a second run).
    std::cerr << "dtctl: warning: could not record job " << out.job_id << " with run " << out.run_id << ": "
              << attached.status().message() << " (status and cancel will not know the job)\n";
  }
  return out;
}

}  // namespace dt::ctl
