// One dttrainer process: register with the coordinator, build the process group through its
// store, prepare data rank0-first, train GPT-2 with DDP, checkpoint in coordinator rounds, report
// metrics, leave. Returns the process exit code: 0 success, 1 this rank failed (reported to the
// coordinator), 2 bad configuration, 3 stopped because the run failed, restarts or was cancelled.
#pragma once

#include "trainer/trainer_config.h"

namespace dt {

int RunTrainer(const TrainerConfig& config);

}  // namespace dt
