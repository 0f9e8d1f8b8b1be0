// A process and everything it started, read from /proc: dt owns every process a rank starts,
// however deep (a wrapper shell, its python, a data loader's workers), and must find them all to
// stop them, to capture their stacks and to tell whether they are busy. Linux only.
//
// Membership has two sources. Ancestry: the descendants of a process (parent links in
// /proc/<pid>/stat; under a child subreaper, orphans stay in the tree). The slot marker: every
// process dt starts for a rank carries DT_SLOT=<run>/g<generation>/<who> in its environment and
// passes it to its own children, so a process that escaped its tree (its subreaper was killed
// with SIGKILL) is still found by run and generation.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dt {

// The environment variable that marks a rank's processes.
inline constexpr char kSlotMarkerEnv[] = "DT_SLOT";

// "<run>/g<generation>/<who>": `who` is "rank-3" or "node-n1".
std::string SlotMarker(const std::string& run_id, int64_t generation, const std::string& who);
// The generation a marker names; nullopt when it is not one of dt's.
std::optional<int64_t> MarkerGeneration(const std::string& marker);

// Which markers a search takes.
using MarkerMatch = std::function<bool(const std::string& marker)>;
// Every process of the run.
MarkerMatch MarkerOfRun(const std::string& run_id);
// The run's processes of generations before `generation`.
MarkerMatch MarkerBeforeGeneration(const std::string& run_id, int64_t generation);
// Exactly these markers.
MarkerMatch MarkerIn(std::vector<std::string> markers);

struct ProcessInfo {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
  char state = '?';          // R, S, D, T, t, Z, X ...
  uint64_t cpu_ticks = 0;    // utime + stime, in clock ticks
  uint64_t start_ticks = 0;  // since boot: with the pid, names one process for good
  std::string comm;          // the kernel's short name
};

// /proc/<pid>/stat; nullopt when the process is gone.
std::optional<ProcessInfo> ReadProcess(pid_t pid);
// Every process visible in /proc.
std::vector<ProcessInfo> AllProcesses();
// The descendants of `root` (not `root` itself), parents before children.
std::vector<pid_t> Descendants(pid_t root);
std::vector<pid_t> Descendants(pid_t root, const std::vector<ProcessInfo>& all);
// The value of `name` in /proc/<pid>/environ (the environment the process started with); nullopt
// when unset or unreadable.
std::optional<std::string> ProcessEnv(pid_t pid, const std::string& name);
// Processes (zombies excluded) whose slot marker `match` takes, this process excluded.
std::vector<pid_t> ProcessesWithMarker(const MarkerMatch& match);
// CPU time (clock ticks) of `pids` together, gone ones counting nothing.
uint64_t CpuTicks(const std::vector<pid_t>& pids);
// The same from a snapshot of AllProcesses(): no second read of /proc (pids not in it count
// nothing).
uint64_t CpuTicks(const std::vector<pid_t>& pids, const std::vector<ProcessInfo>& all);
// Ticks per second (sysconf(_SC_CLK_TCK)).
int64_t ClockTicksPerSecond();
// CPU time this process has used so far, every thread, in seconds (nanosecond resolution, where
// CpuTicks counts in ticks of 10 ms).
double ProcessCpuSeconds();

// Sends `signal` to each pid that is still alive (and SIGCONT after it for SIGTERM, so a stopped
// process takes its SIGTERM now).
void SignalProcesses(const std::vector<pid_t>& pids, int signal);

// Ends every process whose marker `match` takes (not this one): SIGTERM, then SIGKILL to
// whatever is left after `grace`. Waits until they are gone or `grace` + 5 s passed; returns how
// many were found at first. Reaps those that are this process's children (a subreaper inherits
// orphans) and no Subprocess owns. For launchers clearing what an earlier generation left behind.
int EndMarkedProcesses(const MarkerMatch& match, absl::Duration grace);

// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER): a process
// whose parent dies is re-parented here, not to init, so it stays in this process's tree.
void BecomeChildSubreaper();

// Reaps children of this process that are zombies and that no live Subprocess owns (orphans
// inherited as a subreaper, whose status nobody else collects). Returns how many.
int ReapOrphans();
// The same, finding the zombies in a snapshot of AllProcesses() (one that missed a zombie finds
// it at the next call). Each is read again before it is reaped: a pid reaped elsewhere since and
// reused by a new child is left alone.
int ReapOrphans(const std::vector<ProcessInfo>& all);

}  // namespace dt
