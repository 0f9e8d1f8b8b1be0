// Slurm's scontrol and scancel for dtctl and for a rank: a job requeued or cancelled, and what a
// rank does when the coordinator says its Slurm job lost its batch host. Slurm keeps an elastic
// run's --no-kill job RUNNING without its script when the batch host dies: no one else would
// launch the next generation (HeartbeatResponse.requeue_job), or, once the run has ended, end the
// job that still holds the nodes that remain (HeartbeatResponse.cancel_job).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dt/v1/rendezvous.pb.h"

namespace dt {

// `scontrol ARGS...` (scontrol from PATH, 30 s at most): its output, or FAILED_PRECONDITION naming
// the command and its output when it exits non-zero.
absl::StatusOr<std::string> RunScontrol(const std::vector<std::string>& args);

// `scontrol requeue JOB`: the job goes back to the queue and its batch script starts again.
// INVALID_ARGUMENT for a job id that is not Slurm's; as RunScontrol when scontrol fails.
absl::Status RequeueSlurmJob(const std::string& job);

// `scancel -- JOB`. INVALID_ARGUMENT for a job id that is not Slurm's; INTERNAL naming scancel's
// output when it fails.
absl::Status CancelSlurmJob(const std::string& job);

// Claims the action on `job`, whose batch host is lost, for this process: several ranks are told
// (HeartbeatResponse.requeue_job), one must act, since a second requeue would end the requeued job.
// The claim is <exp_dir>/logs/slurm-job-<job>-restart-<SLURM_RESTART_COUNT>-generation-<generation>
// (the generation whose ranks were told), created with O_EXCL on the shared file system and
// holding `what` (who claimed it, and for what). Nothing when this process claimed it; the claim's
// text when another process had; an error naming the file when neither can be told (a file system
// that refuses the create).
absl::StatusOr<std::optional<std::string>> ClaimTheJobOfTheLostBatchHost(const std::string& exp_dir,
                                                                         const std::string& job, int64_t generation,
                                                                         absl::string_view what);

// What a heartbeat's answer asks of `rank` of `generation` about its job, whose batch host is lost,
// once claimed (ClaimTheJobOfTheLostBatchHost in `exp_dir`): RequeueSlurmJob for requeue_job,
// CancelSlurmJob for cancel_job, unless Slurm shows the job requeued since this process started
// (its Restarts past SLURM_RESTART_COUNT: it runs something new, and a second requeue would end
// it). A claim that cannot be made leaves a requeue to the user (every rank told would requeue)
// and a cancel done anyway (a second scancel changes nothing). Says on the log what happened and,
// when it failed, what the user can do. False when the answer asks nothing.
bool ActOnJobOfLostBatchHost(const v1::HeartbeatResponse& reply, const std::string& exp_dir, int64_t generation,
                             int rank);

}  // namespace dt
