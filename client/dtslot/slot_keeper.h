// dtslot: the keeper of one rank's process tree. dt starts every rank's program through it (dtrun
// for a user's program, the local launcher for dttrainer), so every process the program starts,
// however deep and whatever it does with sessions and process groups, belongs to the rank and ends
// with it:
// - it is the child subreaper of the tree: an orphaned grandchild is re-parented to it, not to
//   init, so the tree cannot be escaped by double-forking or setsid;
// - a stop (SIGTERM, SIGINT, SIGHUP or SIGQUIT to dtslot; its starter's death, through
//   PR_SET_PDEATHSIG) sends SIGTERM to every process of the tree, waits the grace, then SIGKILLs
//   what is left;
// - when the program itself ends, what it left running is stopped the same way;
// - it ends the way the program did: the same exit code, or the same signal.
// The program is started with PR_SET_PDEATHSIG(SIGKILL), so a dtslot killed with SIGKILL takes
// the program with it; the program's own descendants then go to the next subreaper up (dtrun, the
// local launcher), which finds them by their slot marker (common/process_tree.h).
// SIGUSR1 and SIGUSR2 are not forwarded: a scheduler signals every process of a job step itself.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dt::slot {

struct SlotOptions {
  std::vector<std::string> command;
  absl::Duration grace = absl::Seconds(10);  // SIGTERM → SIGKILL
  // Non-empty: the program's output goes through a pipe, copied to dtslot's stdout with the time
  // of each chunk recorded here (client/dtslot/output_relay.h). Empty: the program writes to
  // dtslot's stdout and stderr itself.
  std::string times_file;
  // >= 0: the program's wait status is written here, in decimal and a newline, the moment the
  // program ends, and the descriptor closed; the rest of its tree may take up to the grace to
  // stop after it. The starter (dtrun) learns when the rank's program ended, not when dtslot
  // did, which is what says which rank of a failing group ended first. End of file without a
  // status: dtslot ended before its program did (it was killed), or the program never started.
  int status_fd = -1;
};

// Runs `command` as described above and returns what main() should do: the exit code, or
// -signal when the program died by a signal (the caller ends this process by it).
int RunSlot(const SlotOptions& options);

}  // namespace dt::slot
