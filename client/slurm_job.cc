#include "client/slurm_job.h"

#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/names.h"
#include "common/subprocess.h"

namespace dt {
namespace {

// The job's Restarts when Slurm shows one other than this process's SLURM_RESTART_COUNT: the job
// was requeued since this process started. Nothing when they agree or Slurm cannot say.
std::optional<std::string> RequeuedSinceThisProcessStarted(const std::string& job) {
  absl::StatusOr<std::string> shown = RunScontrol({"show", "job", "-o", job});
  if (!shown.ok()) return std::nullopt;
  const char* mine = std::getenv("SLURM_RESTART_COUNT");
  for (absl::string_view field : absl::StrSplit(*shown, absl::ByAnyChar(" \n"), absl::SkipWhitespace())) {
    if (!absl::ConsumePrefix(&field, "Restarts=")) continue;
    if (field == (mine != nullptr && *mine != '\0' ? mine : "0")) return std::nullopt;
    return std::string(field);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::string> RunScontrol(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"scontrol"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<CommandResult> r = RunCommand(argv, absl::Seconds(30));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(absl::StrJoin(argv, " "), ": ", absl::StripAsciiWhitespace(r->output)));
  }
  return r->output;
}

absl::Status RequeueSlurmJob(const std::string& job) {
  if (absl::Status s = ValidateSlurmJobId(job); !s.ok()) return s;
  return RunScontrol({"requeue", job}).status();
}

absl::Status CancelSlurmJob(const std::string& job) {
  // The id came from the coordinator: checked again here, and after "--" it is never an option.
  if (absl::Status s = ValidateSlurmJobId(job); !s.ok()) return s;
  absl::StatusOr<CommandResult> r = RunCommand({"scancel", "--", job}, absl::Seconds(30));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::InternalError(absl::StrCat("scancel ", job, ": ", absl::StripAsciiWhitespace(r->output)));
  }
  return absl::OkStatus();
}

void RequeueJobOfLostBatchHost(const std::string& job) {
  // Said first: the requeue ends this job's processes, this one included, maybe before it returns.
  DT_LOG(Warning) << "the batch host of Slurm job " << job
                  << " is lost and Slurm keeps the job without its script: requeueing it (scontrol requeue " << job
                  << "); the requeued job runs the next generation";
  if (std::optional<std::string> restarts = RequeuedSinceThisProcessStarted(job)) {
    DT_LOG(Info) << "job " << job << " was already requeued (Restarts=" << *restarts << ")";
    return;
  }
  if (absl::Status s = RequeueSlurmJob(job); !s.ok()) {
    DT_LOG(Error) << "requeueing Slurm job " << job << " failed: " << s.message() << ". Run `scontrol requeue " << job
                  << "` (or `dtctl cancel RUN`), or the job holds its nodes until its time limit";
    return;
  }
  DT_LOG(Info) << "requeued Slurm job " << job;
}

void CancelJobOfLostBatchHost(const std::string& job) {
  // Said first: scancel ends this job's processes, this one included, maybe before it returns.
  DT_LOG(Warning)
      << "the run ended and the batch host of Slurm job " << job
      << " is lost: Slurm would keep the job, and the nodes that remain, until its time limit; cancelling it"
      << " (scancel " << job << ")";
  if (std::optional<std::string> restarts = RequeuedSinceThisProcessStarted(job)) {
    DT_LOG(Info) << "job " << job << " was requeued meanwhile (Restarts=" << *restarts << "): not cancelled";
    return;
  }
  if (absl::Status s = CancelSlurmJob(job); !s.ok()) {
    DT_LOG(Error) << "cancelling Slurm job " << job << " failed: " << s.message() << ". Run `scancel " << job
                  << "`, or the job holds its nodes until its time limit";
    return;
  }
  DT_LOG(Info) << "cancelled Slurm job " << job;
}

bool ActOnJobOfLostBatchHost(const v1::HeartbeatResponse& reply) {
  if (!reply.requeue_job().empty()) {
    RequeueJobOfLostBatchHost(reply.requeue_job());
    return true;
  }
  if (!reply.cancel_job().empty()) {
    CancelJobOfLostBatchHost(reply.cancel_job());
    return true;
  }
  return false;
}

}  // namespace dt
