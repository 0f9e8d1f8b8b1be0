// What a hang's evidence costs on one node: capturing the stacks of 2, 8 and 64 processes (the
// ranks of a node and their data-loader workers) with dt's capture (common/stack_capture: Python
// frames from the interpreter's own faulthandler through dt's hook, native frames from eu-stack),
// against what an engineer on call runs today, `gdb -p PID -batch -ex "thread apply all bt"` over
// the same processes with the same parallelism. Goal: 64 processes in at most 2 s.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "common/fs.h"
#include "common/stack_capture.h"
#include "common/subprocess.h"

namespace dt::bench {
namespace {

// A process like a rank's: a main thread down a few Python frames, and a helper thread.
constexpr char kProgram[] =
    "import threading, time\n"
    "def helper():\n"
    "    time.sleep(3600)\n"
    "def load_batch():\n"
    "    time.sleep(3600)\n"
    "def step():\n"
    "    load_batch()\n"
    "threading.Thread(target=helper, daemon=True).start()\n"
    "step()\n";

struct Fleet {
  std::string hooks;
  std::vector<std::unique_ptr<Subprocess>> processes;
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& p : processes) out.push_back(p->pid());
    return out;
  }
};

// `n` Python processes with dt's hook, each registered.
Fleet StartFleet(int n, const std::string& dir) {
  Fleet f;
  f.hooks = JoinPath(dir, absl::StrCat("hooks-", n));
  (void)MakeDirs(f.hooks);
  std::string script = JoinPath(dir, "rank.py");
  (void)WriteFileAtomic(script, kProgram);
  std::string site = JoinPath(ExecutableDir(), "../python/dt_site");
  for (int k = 0; k < n; ++k) {
    f.processes.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{"/usr/bin/python3", script},
        std::map<std::string, std::string>{{"PYTHONPATH", site}, {"DT_STACKS_DIR", f.hooks}}));
  }
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (pid_t pid : f.pids()) {
    while (!FindPythonHook(f.hooks, pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  }
  absl::SleepFor(absl::Milliseconds(300));  // past the hook, into load_batch
  return f;
}

// Seconds for dt to capture every process of `f` (`python`: through the hook, else eu-stack).
double DtCapture(const Fleet& f, bool python, int* frames) {
  StackCaptureOptions o;
  if (python) o.python_hooks_dir = f.hooks;
  o.timeout = absl::Seconds(60);
  absl::Time start = absl::Now();
  std::vector<v1::ProcessStacks> got = CaptureProcessStacks(f.pids(), o);
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  *frames = 0;
  for (const auto& p : got) {
    for (const auto& t : p.threads()) *frames += t.frames_size();
  }
  return seconds;
}

// Seconds for gdb's "thread apply all bt" over every process of `f`, as many at once as dt runs.
double GdbCapture(const Fleet& f) {
  std::vector<pid_t> pids = f.pids();
  int parallel = std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(parallel, static_cast<int>(pids.size())); ++t) {
    threads.emplace_back([&] {
      for (size_t k = next++; k < pids.size(); k = next++) {
        (void)RunCommand({"gdb", "-p", absl::StrCat(pids[k]), "-batch", "-nx", "-ex", "thread apply all bt"},
                         absl::Seconds(120));
      }
    });
  }
  for (auto& t : threads) t.join();
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace
}  // namespace dt::bench

int main() {
  using namespace dt::bench;
  std::string dir = TempDir("capture");
  if (dt::FindOnPath("gdb").empty() || dt::FindEuStack().empty()) {
    std::cerr << "bench_capture: needs gdb (the anchor) and eu-stack (elfutils)\n";
    return 1;
  }
  std::cout << "== stack capture: dt vs gdb over the same processes\n";
  for (int n : {2, 8, 64}) {
    Fleet f = StartFleet(n, dir);
    int rounds = Quick() || n == 64 ? 3 : 5;
    std::vector<double> python_s, native_s;
    int python_frames = 0, native_frames = 0;
    for (int r = 0; r < rounds; ++r) {
      python_s.push_back(DtCapture(f, true, &python_frames));
      native_s.push_back(DtCapture(f, false, &native_frames));
    }
    double gdb = GdbCapture(f);  // once: the anchor is slow, and steady
    double p50 = Summarize(python_s).p50;
    Result r{absl::StrCat("stack capture of ", n, " Python processes (", python_frames, " frames)"),
             p50,
             "s",
             "gdb thread apply all bt",
             gdb,
             n == 64 ? "<= 2 s at 64" : ""};
    Report(r, n == 64 ? std::optional<bool>(p50 <= 2.0) : std::nullopt);
    Report({absl::StrCat("native-only capture (eu-stack) of ", n, " processes (", native_frames, " frames)"),
            Summarize(native_s).p50, "s", "gdb thread apply all bt", gdb, ""});
    for (auto& p : f.processes) p->Signal(SIGKILL);
  }
  return 0;
}
