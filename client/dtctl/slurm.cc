#include "client/dtctl/slurm.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/slurm_job.h"
#include "common/fs.h"
#include "common/names.h"
#include "common/subprocess.h"
#include "common/utf8.h"

namespace dt::ctl {

absl::StatusOr<std::string> FindSbatchTemplate() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DT_SBATCH_TEMPLATE"); env != nullptr && *env != '\0') candidates.push_back(env);
  std::string exe = ExecutableDir();
  candidates.push_back(JoinPath(exe, "../share/dt/dt.sbatch.tmpl"));
  candidates.push_back(JoinPath(exe, "../../deploy/slurm/dt.sbatch.tmpl"));
#ifdef DT_SOURCE_TEMPLATE
  candidates.push_back(DT_SOURCE_TEMPLATE);
#endif
  for (const auto& c : candidates) {
    absl::StatusOr<std::string> text = ReadFile(c);
    if (text.ok()) return text;
  }
  return absl::NotFoundError(absl::StrCat("no sbatch template found (looked at ", absl::StrJoin(candidates, ", "),
                                          "); set DT_SBATCH_TEMPLATE"));
}

std::string ShellQuote(const std::string& word) {
  bool safe = !word.empty();
  for (char c : word) {
    safe = safe && (absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                    std::string("-_./=:,@%+").find(c) != std::string::npos);
  }
  if (safe) return word;
  return absl::StrCat("'", absl::StrReplaceAll(word, {{"'", "'\\''"}}), "'");
}

absl::StatusOr<std::string> RenderTemplate(const std::string& text, const std::map<std::string, std::string>& values) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t open = text.find("{{", pos);
    if (open == std::string::npos) {
      out.append(text, pos, std::string::npos);
      return out;
    }
    size_t close = text.find("}}", open);
    if (close == std::string::npos) return absl::InvalidArgumentError("unterminated {{ in the template");
    out.append(text, pos, open - pos);
    std::string name = text.substr(open + 2, close - open - 2);
    auto it = values.find(name);
    if (it == values.end())
      return absl::InvalidArgumentError(absl::StrCat("unknown template placeholder {{", name, "}}"));
    out += it->second;
    pos = close + 2;
  }
}

namespace {

// The trainer as srun starts it: through env(1) with the run's variables, so they reach the
// trainers and not the batch script's own commands.
std::string TrainerCommand(const SbatchParams& p) {
  if (p.trainer_env.empty()) return ShellQuote(p.trainer);
  std::vector<std::string> words = {"env"};
  for (const auto& [k, v] : p.trainer_env) words.push_back(ShellQuote(absl::StrCat(k, "=", v)));
  words.push_back(ShellQuote(p.trainer));
  return absl::StrJoin(words, " ");
}

}  // namespace

absl::StatusOr<std::string> RenderSbatch(const std::string& template_text, const SbatchParams& p) {
  // What lands in an #SBATCH line is one line: a line break (or any control character) in a value
  // would end sbatch's header early or add an option of its own. Everything else is shell-quoted.
  if (absl::Status s = ValidateSingleLine("the job name", p.job_name); !s.ok()) return s;
  // An elastic run needs a script that places each step on the generation's nodes: an older or
  // hand-made template would launch every step on the whole allocation, which a shrunk generation
  // refuses.
  if (p.min_nodes > 0 && template_text.find("{{ELASTIC}}") == std::string::npos) {
    return absl::InvalidArgumentError(
        "the sbatch template has no {{ELASTIC}} placeholder, so it cannot place an elastic run's steps "
        "(--nodes MIN:MAX) on the nodes that remain: start from deploy/slurm/dt.sbatch.tmpl, or give --nodes a "
        "single count");
  }
  std::string extra;
  for (const auto& arg : p.sbatch_args) {
    if (absl::Status s = ValidateSingleLine("the --sbatch-arg", arg); !s.ok()) return s;
    absl::StrAppend(&extra, "#SBATCH ", arg, "\n");
  }
  std::vector<std::string> args;
  for (const auto& a : p.trainer_args) args.push_back(ShellQuote(a));
  std::map<std::string, std::string> values = {
      {"JOB_NAME", ShellQuote(p.job_name)},
      {"NODES", absl::StrCat(p.nodes)},
      {"ELASTIC", p.min_nodes > 0 ? "1" : "0"},
      {"NO_KILL", p.min_nodes > 0 ? "#SBATCH --no-kill" : "# (a node failure ends the job: it is requeued)"},
      {"NNODES_ARGS", p.pass_step_nodes ? "--nnodes \"$step_nnodes\" " : ""},
      {"TASKS_PER_NODE", absl::StrCat(p.tasks_per_node)},
      {"PREEMPT_GRACE", absl::StrCat(p.preempt_grace_s)},
      {"CPUS_PER_TASK", p.cpus_per_task > 0 ? absl::StrCat("#SBATCH --cpus-per-task=", p.cpus_per_task)
                                            : "# (Slurm's default CPUs per task)"},
      {"GRES", p.gpus_per_node > 0 ? absl::StrCat("#SBATCH --gres=gpu:", p.gpus_per_node) : "# (no GPUs requested)"},
      {"LOGS_DIR", p.logs_dir},
      {"EXP_DIR", ShellQuote(p.exp_dir)},
      {"EXTRA_SBATCH", extra},
      {"COORDINATOR", ShellQuote(p.coordinator)},
      {"RUN_ID", ShellQuote(p.run_id)},
      {"RUN_TOKEN", ShellQuote(p.run_token)},
      {"TLS_CA", ShellQuote(p.tls_ca)},
      {"OMP_THREADS", p.omp_threads > 0
                          ? absl::StrCat("export OMP_NUM_THREADS=", p.omp_threads)
                          : "# OMP_NUM_THREADS: dtrun's default (1 per process when a node runs several)"},
      {"TRAINER", TrainerCommand(p)},
      {"TRAINER_ARGS", absl::StrJoin(args, " ")},
      {"DTCTL", ShellQuote(p.dtctl)},
  };
  if (absl::Status s = ValidateSingleLine("the logs directory", p.logs_dir); !s.ok()) return s;
  if (p.logs_dir.find_first_of(" '\"$`") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the logs directory ", PrintableForTerminal(p.logs_dir),
                                                   " contains characters #SBATCH --output cannot take"));
  }
  return RenderTemplate(template_text, values);
}

absl::StatusOr<std::string> SubmitBatch(const std::string& script) {
  absl::StatusOr<CommandResult> r = RunCommand({"sbatch", "--parsable", script}, absl::Minutes(1));
  if (!r.ok()) return r.status();
  std::string out(absl::StripAsciiWhitespace(r->output));
  if (r->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("sbatch refused the job: ", out));
  }
  // --parsable prints "jobid" or "jobid;cluster"; keep the id.
  std::string id = std::string(
      absl::StripAsciiWhitespace(out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1)));
  id = id.substr(0, id.find(';'));
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InternalError(absl::StrCat("unexpected sbatch output: ", out));
  }
  return id;
}

absl::StatusOr<SlurmJob> QueryJob(const std::string& job_id) {
  if (absl::Status s = ValidateSlurmJobId(job_id); !s.ok()) return s;
  absl::StatusOr<CommandResult> r = RunCommand({"squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"}, absl::Seconds(20));
  if (!r.ok()) return r.status();
  std::string line(absl::StripAsciiWhitespace(r->output));
  if (r->exit_code != 0 || line.empty()) {
    // Finished jobs leave squeue; scontrol remembers them for MinJobAge.
    absl::StatusOr<CommandResult> s = RunCommand({"scontrol", "show", "job", "-o", job_id}, absl::Seconds(20));
    if (!s.ok() || s->exit_code != 0) return absl::NotFoundError(absl::StrCat("Slurm no longer knows job ", job_id));
    SlurmJob job{job_id, "", "", ""};
    for (absl::string_view field : absl::StrSplit(s->output, ' ', absl::SkipWhitespace())) {
      if (absl::ConsumePrefix(&field, "JobState="))
        job.state = std::string(field);
      else if (absl::ConsumePrefix(&field, "Reason="))
        job.reason = std::string(field);
      else if (absl::ConsumePrefix(&field, "NodeList="))
        job.nodes = std::string(field);
    }
    return job;
  }
  std::vector<std::string> parts = absl::StrSplit(line, '|');
  parts.resize(3);
  return SlurmJob{job_id, parts[0], parts[1], parts[2]};
}

absl::StatusOr<std::string> DescribeNode(const std::string& node) {
  if (absl::Status s = ValidateNodeName(node); !s.ok()) return s;
  absl::StatusOr<std::string> out = RunScontrol({"show", "node", "-o", node});
  if (!out.ok()) return absl::NotFoundError(out.status().message());
  return std::string(absl::StripAsciiWhitespace(*out));
}

absl::StatusOr<std::vector<std::string>> ExpandHostlist(const std::string& hostlist) {
  if (hostlist.empty() || hostlist.front() == '-') {
    return absl::InvalidArgumentError(absl::StrCat("\"", hostlist, "\" is not a node list"));
  }
  absl::StatusOr<std::string> out = RunScontrol({"show", "hostnames", hostlist});
  if (!out.ok()) return out.status();
  return std::vector<std::string>(absl::StrSplit(*out, '\n', absl::SkipWhitespace()));
}

absl::Status ExcludeNodesFromJob(const std::string& job_id, const std::vector<std::string>& nodes) {
  if (absl::Status s = ValidateSlurmJobId(job_id); !s.ok()) return s;
  for (const std::string& n : nodes) {
    if (absl::Status s = ValidateNodeName(n); !s.ok()) return s;
  }
  return RunScontrol(
             {"update", absl::StrCat("JobId=", job_id), absl::StrCat("ExcNodeList=", absl::StrJoin(nodes, ","))})
      .status();
}

absl::StatusOr<absl::Duration> SlurmdTimeout() {
  absl::StatusOr<std::string> out = RunScontrol({"show", "config"});
  if (!out.ok()) return out.status();
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    if (!absl::ConsumePrefix(&line, "SlurmdTimeout")) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "=")) continue;
    int seconds = 0;
    std::vector<std::string> words = absl::StrSplit(absl::StripAsciiWhitespace(line), ' ');
    if (!words.empty() && absl::SimpleAtoi(words[0], &seconds)) return absl::Seconds(seconds);
  }
  return absl::NotFoundError("scontrol show config names no SlurmdTimeout");
}

}  // namespace dt::ctl
