// What starting a rank costs its starter: dtrun is a multithreaded process of about 21 MB whose
// threads keep writing memory (gRPC's pollers, heartbeats, the store relay) while it starts one
// dtslot per rank, and every restart starts them all again. The time until Subprocess::Spawn
// returns (the child has exec'd) is set against a plain fork and exec of the same program from
// the same process, waited for the same way (a close-on-exec pipe). The program is /bin/true.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "common/subprocess.h"

namespace dt::bench {
namespace {

constexpr size_t kResidentBytes = size_t{21} << 20;  // dtrun's resident size during a run
constexpr int kBusyThreads = 2;

// Seconds from the start until the child exec'd: a fork, the exec, the pipe closing on it.
double ForkAndExec(const char* program) {
  absl::Time start = absl::Now();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    char* const argv[] = {const_cast<char*>(program), nullptr};
    ::execv(program, argv);
    ::_exit(127);
  }
  ::close(fds[1]);
  char byte;
  while (::read(fds[0], &byte, 1) < 0 && errno == EINTR) {
  }
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  ::close(fds[0]);
  int status;
  ::waitpid(pid, &status, 0);
  return seconds;
}

double SpawnAndExec(const char* program) {
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({program});
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!p.ok()) {
    std::cerr << p.status() << "\n";
    return -1;
  }
  (*p)->Wait(absl::Seconds(10));
  return seconds;
}

void Run() {
  // The resident memory, and threads that keep writing it, as dtrun's do.
  std::vector<char> memory(kResidentBytes);
  std::memset(memory.data(), 1, memory.size());
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int t = 0; t < kBusyThreads; ++t) {
    busy.emplace_back([&, t] {
      size_t at = t * 4096;
      while (!stop.load(std::memory_order_relaxed)) {
        memory[at % memory.size()] ^= 1;
        at += 4096 * kBusyThreads;
        if (at % (1 << 20) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  const int rounds = Quick() ? 40 : 200;
  std::vector<double> vfork_s, fork_s;
  for (int r = 0; r < rounds; ++r) {  // interleaved, so that drift falls on both
    vfork_s.push_back(SpawnAndExec("/bin/true"));
    fork_s.push_back(ForkAndExec("/bin/true"));
  }
  stop = true;
  for (auto& t : busy) t.join();
  Summary dt = Summarize(vfork_s), anchor = Summarize(fork_s);
  Report({"start a rank's process from a 21 MB starter with 2 busy threads (median)", dt.p50, "s",
          "fork and exec from the same process", anchor.p50, "<= 0.5x", false, 0.5});
}

}  // namespace
}  // namespace dt::bench

int main() {
  dt::bench::Run();
  return 0;
}
