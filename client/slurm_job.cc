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

bool ActOnJobOfLostBatchHost(const v1::HeartbeatResponse& reply) {
  const bool cancel = reply.requeue_job().empty();
  const std::string& job = cancel ? reply.cancel_job() : reply.requeue_job();
  if (job.empty()) return false;
  const char* doing = cancel ? "cancelling" : "requeueing";
  const std::string by_hand = cancel ? absl::StrCat("`scancel ", job, "`")
                                     : absl::StrCat("`scontrol requeue ", job, "` (or `dtctl cancel RUN`)");
  if (absl::Status s = ValidateSlurmJobId(job); !s.ok()) {
    DT_LOG(Error) << "the coordinator asked this rank to act on Slurm job " << job << ": " << s.message();
    return true;
  }
  // Said first: a requeue or a cancel ends this job's processes, this one included, maybe before it
  // returns.
  if (cancel) {
    DT_LOG(Warning) << "the run ended and the batch host of Slurm job " << job
                    << " is lost: Slurm would keep the job, and the nodes that remain, until its time limit; "
                       "cancelling it (scancel "
                    << job << ")";
  } else {
    DT_LOG(Warning) << "the batch host of Slurm job " << job
                    << " is lost and Slurm keeps the job without its script: requeueing it (scontrol requeue " << job
                    << "); the requeued job runs the next generation";
  }
  // A job requeued since this process started runs something new, and a second requeue would end it.
  if (std::optional<std::string> restarts = RequeuedSinceThisProcessStarted(job)) {
    DT_LOG(Info) << "job " << job << " was requeued meanwhile (Restarts=" << *restarts << "): left alone";
    return true;
  }
  absl::Status s = cancel ? CancelSlurmJob(job) : RequeueSlurmJob(job);
  if (!s.ok()) {
    DT_LOG(Error) << doing << " Slurm job " << job << " failed: " << s.message() << ". Run " << by_hand
                  << ", or the job holds its nodes until its time limit";
    return true;
  }
  DT_LOG(Info) << (cancel ? "cancelled" : "requeued") << " Slurm job " << job;
  return true;
}

}  // namespace dt
