// The batch script dtctl renders, from any parameters: a refusal naming the cause, or a script
// whose #SBATCH header holds exactly the options dtctl meant (no value can end a line early and
// smuggle in an option of its own, e.g. a job name with "\n#SBATCH --uid=0").
#include <cstdint>
#include <sstream>

#include "absl/strings/match.h"
#include "client/dtctl/slurm.h"
#include "common/fs.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"

namespace {

const std::string& Template() {
  static const std::string* text = [] {
    auto t = dt::ReadFile(DT_SOURCE_DIR "/deploy/slurm/dt.sbatch.tmpl");
    if (!t.ok()) dt::fuzz::Fail("cannot read the template: " + t.status().ToString());
    return new std::string(*t);
  }();
  return *text;
}

// The #SBATCH lines before the first line that is neither a comment nor blank (where sbatch stops
// reading options).
int HeaderOptions(const std::string& script) {
  std::istringstream lines(script);
  std::string line;
  int options = 0;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] != '#') break;
    if (absl::StartsWith(line, "#SBATCH")) ++options;
  }
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  dt::fuzz::FuzzInput in(data, size);
  dt::ctl::SbatchParams p;
  p.job_name = in.String(64);
  p.nodes = in.Int(1, 1024);
  p.tasks_per_node = in.Int(1, 64);
  p.cpus_per_task = in.Int(0, 64);
  p.preempt_grace_s = in.Int(10, 86400);
  p.gpus_per_node = in.Int(0, 16);
  p.logs_dir = in.String(128);
  p.exp_dir = in.String(128);
  for (int n = in.Int(0, 3); n > 0; --n) p.sbatch_args.push_back(in.String(64));
  p.coordinator = in.String(64);
  p.run_id = in.String(40);
  p.run_token = in.String(80);
  p.tls_ca = in.String(64);
  p.omp_threads = in.Int(0, 64);
  p.trainer = in.String(64);
  for (int n = in.Int(0, 4); n > 0; --n) p.trainer_args.push_back(in.String(64));
  p.dtctl = in.String(64);
  p.min_nodes = in.Int(0, 3);
  p.pass_step_nodes = in.Int(0, 1) == 1;

  absl::StatusOr<std::string> script = dt::ctl::RenderSbatch(Template(), p);
  if (!script.ok()) {
    dt::fuzz::CheckRefusal(script.status(), "RenderSbatch");
    return 0;
  }
  // The template's own options, the optional CPU, GPU and --no-kill lines, one per --sbatch-arg.
  static const int kTemplateOptions = [] {  // a script from plain values: the template's own
    dt::ctl::SbatchParams plain;
    plain.job_name = "job";
    plain.logs_dir = "/logs";
    absl::StatusOr<std::string> script = dt::ctl::RenderSbatch(Template(), plain);
    if (!script.ok()) dt::fuzz::Fail("plain values refused: " + script.status().ToString());
    return HeaderOptions(*script);
  }();
  int want = kTemplateOptions + (p.cpus_per_task > 0) + (p.gpus_per_node > 0) + (p.min_nodes > 0) +
             static_cast<int>(p.sbatch_args.size());
  int got = HeaderOptions(*script);
  dt::fuzz::Check(got == want, "the script's #SBATCH header has " + std::to_string(got) + " options, dtctl meant " +
                                   std::to_string(want));
  return 0;
}
