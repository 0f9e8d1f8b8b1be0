#include "common/process_tree.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/subprocess.h"

namespace dt {

std::string SlotMarker(const std::string& run_id, int64_t generation, const std::string& who) {
  return absl::StrCat(run_id, "/g", generation, "/", who);
}

std::optional<int64_t> MarkerGeneration(const std::string& marker) {
  std::vector<std::string> parts = absl::StrSplit(marker, '/');
  int64_t g = 0;
  if (parts.size() != 3 || parts[1].size() < 2 || parts[1][0] != 'g' || !absl::SimpleAtoi(parts[1].substr(1), &g)) {
    return std::nullopt;
  }
  return g;
}

MarkerMatch MarkerOfRun(const std::string& run_id) {
  return [prefix = absl::StrCat(run_id, "/g")](const std::string& m) { return absl::StartsWith(m, prefix); };
}

MarkerMatch MarkerBeforeGeneration(const std::string& run_id, int64_t generation) {
  return [of_run = MarkerOfRun(run_id), generation](const std::string& m) {
    std::optional<int64_t> g = MarkerGeneration(m);
    return of_run(m) && g && *g < generation;
  };
}

MarkerMatch MarkerIn(std::vector<std::string> markers) {
  return [markers = std::move(markers)](const std::string& m) {
    return std::find(markers.begin(), markers.end(), m) != markers.end();
  };
}

std::optional<ProcessInfo> ReadProcess(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses; it ends at the last ')'.
  size_t open = line.find('(');
  size_t close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  ProcessInfo p;
  p.pid = pid;
  p.comm = line.substr(open + 1, close - open - 1);
  std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(line).substr(close + 2), ' ');
  // Fields after comm, numbered from 0 here: state(0) ppid(1) pgrp(2) ... utime(11) stime(12) ...
  // starttime(19).
  if (f.size() < 20 || f[0].empty()) return std::nullopt;
  p.state = f[0][0];
  int64_t ppid = 0, pgrp = 0;
  uint64_t utime = 0, stime = 0, start = 0;
  if (!absl::SimpleAtoi(f[1], &ppid) || !absl::SimpleAtoi(f[2], &pgrp) || !absl::SimpleAtoi(f[11], &utime) ||
      !absl::SimpleAtoi(f[12], &stime) || !absl::SimpleAtoi(f[19], &start)) {
    return std::nullopt;
  }
  p.ppid = static_cast<pid_t>(ppid);
  p.pgrp = static_cast<pid_t>(pgrp);
  p.cpu_ticks = utime + stime;
  p.start_ticks = start;
  return p;
}

std::vector<ProcessInfo> AllProcesses() {
  std::vector<ProcessInfo> out;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return out;
  while (struct dirent* e = ::readdir(dir)) {
    int64_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid <= 0) continue;
    if (std::optional<ProcessInfo> p = ReadProcess(static_cast<pid_t>(pid))) out.push_back(*p);
  }
  ::closedir(dir);
  return out;
}

std::vector<pid_t> Descendants(pid_t root, const std::vector<ProcessInfo>& all) {
  std::multimap<pid_t, pid_t> children;
  for (const ProcessInfo& p : all) children.emplace(p.ppid, p.pid);
  std::vector<pid_t> out;
  std::vector<pid_t> frontier = {root};
  while (!frontier.empty()) {
    std::vector<pid_t> next;
    for (pid_t parent : frontier) {
      auto [b, e] = children.equal_range(parent);
      for (auto it = b; it != e; ++it) {
        if (it->second == root || std::find(out.begin(), out.end(), it->second) != out.end()) continue;
        out.push_back(it->second);
        next.push_back(it->second);
      }
    }
    frontier = std::move(next);
  }
  return out;
}

std::vector<pid_t> Descendants(pid_t root) { return Descendants(root, AllProcesses()); }

std::optional<std::string> ProcessEnv(pid_t pid, const std::string& name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
  if (!in) return std::nullopt;
  std::string entry;
  std::string prefix = name + "=";
  while (std::getline(in, entry, '\0')) {
    if (absl::StartsWith(entry, prefix)) return entry.substr(prefix.size());
  }
  return std::nullopt;
}

std::vector<pid_t> ProcessesWithMarker(const MarkerMatch& match) {
  std::vector<pid_t> out;
  pid_t self = ::getpid();
  for (const ProcessInfo& p : AllProcesses()) {
    if (p.pid == self || p.state == 'Z' || p.state == 'X') continue;
    std::optional<std::string> marker = ProcessEnv(p.pid, kSlotMarkerEnv);
    if (marker && match(*marker)) out.push_back(p.pid);
  }
  return out;
}

double ProcessCpuSeconds() {
  timespec t{};
  if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

uint64_t CpuTicks(const std::vector<pid_t>& pids) {
  uint64_t total = 0;
  for (pid_t pid : pids) {
    if (std::optional<ProcessInfo> p = ReadProcess(pid)) total += p->cpu_ticks;
  }
  return total;
}

uint64_t CpuTicks(const std::vector<pid_t>& pids, const std::vector<ProcessInfo>& all) {
  std::vector<pid_t> sorted = pids;
  std::sort(sorted.begin(), sorted.end());
  uint64_t total = 0;
  for (const ProcessInfo& p : all) {
    if (std::binary_search(sorted.begin(), sorted.end(), p.pid)) total += p.cpu_ticks;
  }
  return total;
}

int64_t ClockTicksPerSecond() {
  static const int64_t ticks = std::max<int64_t>(1, ::sysconf(_SC_CLK_TCK));
  return ticks;
}

void SignalProcesses(const std::vector<pid_t>& pids, int signal) {
  for (pid_t pid : pids) {
    if (pid <= 1) continue;
    ::kill(pid, signal);
    if (signal == SIGTERM) ::kill(pid, SIGCONT);
  }
}

int EndMarkedProcesses(const MarkerMatch& match, absl::Duration grace) {
  std::vector<pid_t> found = ProcessesWithMarker(match);
  if (found.empty()) return 0;
  SignalProcesses(found, SIGTERM);
  absl::Time kill_at = absl::Now() + grace;
  absl::Time give_up = kill_at + absl::Seconds(5);
  bool killed = false;
  while (true) {
    ReapOrphans();
    std::vector<pid_t> left = ProcessesWithMarker(match);
    if (left.empty() || absl::Now() >= give_up) break;
    if (!killed && absl::Now() >= kill_at) {
      SignalProcesses(left, SIGKILL);
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return static_cast<int>(found.size());
}

void BecomeChildSubreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

int ReapOrphans() { return ReapOrphans(AllProcesses()); }

int ReapOrphans(const std::vector<ProcessInfo>& all) {
  int reaped = 0;
  pid_t self = ::getpid();
  for (const ProcessInfo& p : all) {
    if (p.ppid != self || p.state != 'Z') continue;
    // Still that zombie? A snapshot's pid may have been reaped since and given to a new child,
    // whose status is its owner's to collect.
    std::optional<ProcessInfo> now = ReadProcess(p.pid);
    if (!now || now->state != 'Z' || now->ppid != self || now->start_ticks != p.start_ticks) continue;
    if (ReapIfNotOwned(p.pid)) ++reaped;
  }
  return reaped;
}

}  // namespace dt
