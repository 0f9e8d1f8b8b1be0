#include "client/slurm_job.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/dir_fd.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/log.h"
#include "common/names.h"
#include "common/subprocess.h"

namespace dt {
namespace {

// SLURM_RESTART_COUNT: how many times this process's job was requeued before it started ("0"
// outside a requeue, and for anything that is not a count).
std::string ThisJobsRestartCount() {
  const char* count = std::getenv("SLURM_RESTART_COUNT");
  if (count == nullptr || *count == '\0' || std::strlen(count) > 9) return "0";
  for (const char* c = count; *c != '\0'; ++c) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(*c))) return "0";
  }
  return count;
}

// The job's Restarts when Slurm shows one other than this process's SLURM_RESTART_COUNT: the job
// was requeued since this process started. Nothing when they agree or Slurm cannot say.
std::optional<std::string> RequeuedSinceThisProcessStarted(const std::string& job) {
  absl::StatusOr<std::string> shown = RunScontrol({"show", "job", "-o", job});
  if (!shown.ok()) return std::nullopt;
  for (absl::string_view field : absl::StrSplit(*shown, absl::ByAnyChar(" \n"), absl::SkipWhitespace())) {
    if (!absl::ConsumePrefix(&field, "Restarts=")) continue;
    if (field == ThisJobsRestartCount()) return std::nullopt;
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

absl::StatusOr<std::optional<std::string>> ClaimTheJobOfTheLostBatchHost(const std::string& exp_dir,
                                                                         const std::string& job, int64_t generation,
                                                                         absl::string_view what) {
  if (absl::Status s = ValidateSlurmJobId(job); !s.ok()) return s;
  if (exp_dir.empty()) return absl::FailedPreconditionError("the run's experiment directory is not known here");
  const std::string logs = JoinPath(exp_dir, "logs");
  if (absl::Status s = MakeDirs(logs); !s.ok()) return s;
  const std::string path =
      JoinPath(logs, absl::StrCat("slurm-job-", job, "-restart-", ThisJobsRestartCount(), "-generation-", generation));
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const int err = errno;
    if (err != EEXIST) return ErrnoStatus("create", path, err);
    // Read while its creator may still be writing it: empty then, and claimed all the same.
    absl::StatusOr<std::string> claim = ReadFile(path);
    std::string text = claim.ok() ? std::string(absl::StripAsciiWhitespace(*claim)) : "";
    return std::optional<std::string>(text.empty() ? absl::StrCat("claimed in ", path) : text);
  }
  const std::string text = absl::StrCat(what, "\n");
  (void)WriteFully(fd.get(), text.data(), text.size());  // the file is the claim; its text says who
  return std::optional<std::string>();
}

bool ActOnJobOfLostBatchHost(const v1::HeartbeatResponse& reply, const std::string& exp_dir, int64_t generation,
                             int rank) {
  const bool cancel = reply.requeue_job().empty();
  const std::string& job = cancel ? reply.cancel_job() : reply.requeue_job();
  if (job.empty()) return false;
  const char* doing = cancel ? "cancelling" : "requeueing";
  const std::string command = cancel ? absl::StrCat("scancel ", job) : absl::StrCat("scontrol requeue ", job);
  const std::string by_hand =
      cancel ? absl::StrCat("`", command, "`") : absl::StrCat("`", command, "` (or `dtctl cancel RUN`)");
  if (absl::Status s = ValidateSlurmJobId(job); !s.ok()) {
    DT_LOG(Error) << "the coordinator asked this rank to act on Slurm job " << job << ": " << s.message();
    return true;
  }
  // Several ranks are asked; the one whose claim lands acts.
  const std::string what =
      absl::StrCat("rank ", rank, " (pid ", ::getpid(), " on ", NodeName(), ") claimed `", command, "` at ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()),
                   ": the batch host of Slurm job ", job, " was lost");
  absl::StatusOr<std::optional<std::string>> claim = ClaimTheJobOfTheLostBatchHost(exp_dir, job, generation, what);
  if (!claim.ok() && !cancel) {
    // Every rank told would requeue, and a second requeue can end the requeued job.
    DT_LOG(Error) << "cannot claim the requeue of Slurm job " << job << ", whose batch host is lost ("
                  << claim.status().message() << "): left alone. Run " << by_hand
                  << ", or the job holds its nodes until its time limit";
    return true;
  }
  if (!claim.ok()) {
    DT_LOG(Warning) << "cannot claim the cancel of Slurm job " << job << " (" << claim.status().message()
                    << "): cancelling it all the same (a second scancel changes nothing)";
  } else if (claim->has_value()) {
    DT_LOG(Info) << "Slurm job " << job << " is left to the rank that claimed it: " << **claim;
    return true;
  }
  // Said first: a requeue or a cancel ends this job's processes, this one included, maybe before it
  // returns.
  if (cancel) {
    DT_LOG(Warning) << "the run ended and the batch host of Slurm job " << job
                    << " is lost: Slurm would keep the job, and the nodes that remain, until its time limit; "
                       "cancelling it ("
                    << command << ")";
  } else {
    DT_LOG(Warning) << "the batch host of Slurm job " << job
                    << " is lost and Slurm keeps the job without its script: requeueing it (" << command
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
