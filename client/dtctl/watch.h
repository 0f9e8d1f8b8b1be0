// `dtctl watch`: a live view of a run until it ends — a progress bar (step/total, tokens/s, ETA),
// the last loss, and the per-rank step-time spread (the straggler). Plain lines when stdout is
// not a terminal. Exit 0 only if the run SUCCEEDED.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include "client/coordinator_client.h"

namespace dt::ctl {

int Watch(const std::shared_ptr<CoordinatorClient>& client, const std::string& run_id, bool tty, std::ostream& out);

}  // namespace dt::ctl
