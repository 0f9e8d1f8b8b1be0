// What a rank does when the coordinator says its Slurm job lost its batch host: requeue the job.
// Slurm keeps an elastic run's --no-kill job RUNNING without its script when the batch host dies,
// so no one else would launch the next generation (HeartbeatResponse.requeue_job).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dt {

// `scontrol requeue JOB` (scontrol from PATH, 30 s at most). INVALID_ARGUMENT for a job id that is
// not Slurm's; FAILED_PRECONDITION when Slurm shows the job requeued since this process started
// (its Restarts past SLURM_RESTART_COUNT); INTERNAL with scontrol's output when it fails.
absl::Status RequeueSlurmJob(const std::string& job);

// RequeueSlurmJob, saying on the log what happened and, when it failed, what the user can do.
void RequeueJobOfLostBatchHost(const std::string& job);

}  // namespace dt
