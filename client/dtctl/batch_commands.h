// The commands the rendered sbatch script calls (hidden from --help): await-restart,
// requeue-wanted, attach-requeued, exclude-failed-nodes, await-silent-node, step-nodes, report-step. Each
// returns dtctl's exit code.
#pragma once

#include <cstdint>
#include <string>

#include "client/dtctl/command.h"

namespace dt::ctl {

int AwaitRestart(Global& g, const std::string& run_id);
int RequeueWanted(Global& g, const std::string& run_id);
int AttachBatch(Global& g, const std::string& run_id, const std::string& job_id);
int AttachRequeued(Global& g, const std::string& run_id, const std::string& job_id);
int ExcludeFailedNodes(Global& g, const std::string& run_id, const std::string& job_id, const std::string& allocation);
int AwaitSilentNode(Global& g, const std::string& run_id, const std::string& allocation);
int StepNodes(Global& g, const std::string& run_id);
int ReportStep(Global& g, const std::string& run_id, int64_t generation, int exit_code, const std::string& srun_log);

}  // namespace dt::ctl
