#include "client/job_requeue.h"

#include <cstdlib>
#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/names.h"
#include "common/subprocess.h"

namespace dt {

absl::Status RequeueSlurmJob(const std::string& job) {
  if (absl::Status s = ValidateSlurmJobId(job); !s.ok()) return s;
  // A job requeued since this process started (a reply said twice) is left alone: requeueing it
  // again would end the requeued job.
  const char* mine = std::getenv("SLURM_RESTART_COUNT");
  absl::StatusOr<CommandResult> shown = RunCommand({"scontrol", "show", "job", "-o", job}, absl::Seconds(30));
  if (shown.ok() && shown->exit_code == 0) {
    absl::string_view out = shown->output;
    size_t at = out.find(" Restarts=");
    if (at != absl::string_view::npos) {
      absl::string_view count = out.substr(at + 10, out.find(' ', at + 10) - (at + 10));
      if (count != (mine != nullptr && *mine != '\0' ? mine : "0")) {
        return absl::FailedPreconditionError(absl::StrCat("job ", job, " was already requeued (Restarts=", count, ")"));
      }
    }
  }
  absl::StatusOr<CommandResult> r = RunCommand({"scontrol", "requeue", job}, absl::Seconds(30));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::InternalError(absl::StrCat("scontrol requeue ", job, " exited with ", r->exit_code, ": ", r->output));
  }
  return absl::OkStatus();
}

void RequeueJobOfLostBatchHost(const std::string& job) {
  // Said first: the requeue ends this job's processes, this one included, maybe before it returns.
  DT_LOG(Warning) << "the batch host of Slurm job " << job
                  << " is lost and Slurm keeps the job without its script: requeueing it (scontrol requeue " << job
                  << "); the requeued job runs the next generation";
  absl::Status s = RequeueSlurmJob(job);
  if (s.ok()) {
    DT_LOG(Info) << "requeued Slurm job " << job;
  } else if (absl::IsFailedPrecondition(s)) {
    DT_LOG(Info) << s.message();
  } else {
    DT_LOG(Error) << "requeueing Slurm job " << job << " failed: " << s.message() << ". Run `scontrol requeue " << job
                  << "` (or `dtctl cancel RUN`), or the job holds its nodes until its time limit";
  }
}

}  // namespace dt
