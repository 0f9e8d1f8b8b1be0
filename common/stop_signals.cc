#include "common/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dt {
namespace {

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

struct StopHandler {
  absl::Mutex mu;
  std::function<void(int)> on_signal ABSL_GUARDED_BY(mu);
  bool watching ABSL_GUARDED_BY(mu) = false;
};

StopHandler& Handler() {
  static StopHandler* handler = new StopHandler;  // never destroyed: the watcher outlives main()
  return *handler;
}

std::atomic<bool> preemption_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void OnPreemptionSignal(int) { preemption_requested.store(true, std::memory_order_relaxed); }

}  // namespace

void WatchPreemptionSignal() {
  struct sigaction action {};
  action.sa_handler = OnPreemptionSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR2, &action, nullptr);
}

bool PreemptionRequested() { return preemption_requested.load(std::memory_order_relaxed); }

std::string SignalName(int signal) {
  const char* name = sigabbrev_np(signal);
  return name != nullptr ? absl::StrCat("SIG", name) : absl::StrCat("signal ", signal);
}

void BlockStopSignals() {
  sigset_t set = StopSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForStopSignal() {
  sigset_t set = StopSet();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal;
}

void DieBySignal(int signal) {
  ::signal(signal, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  // raise() delivers to this thread, where the signal is now unblocked with its default action.
  ::raise(signal);
  std::_Exit(128 + signal);  // only if the default action did not end the process
}

void WatchStopSignals() {
  StopHandler& h = Handler();
  {
    absl::MutexLock lock(&h.mu);
    if (h.watching) return;
    h.watching = true;
  }
  std::thread([&h] {
    int signal = WaitForStopSignal();
    {
      // Held until the process ends: a handler uninstalled meanwhile waits, and none runs twice.
      h.mu.Lock();
      if (h.on_signal) h.on_signal(signal);
    }
    DieBySignal(signal);
  }).detach();
}

ScopedStopHandler::ScopedStopHandler(std::function<void(int signal)> on_signal) {
  absl::MutexLock lock(&Handler().mu);
  Handler().on_signal = std::move(on_signal);
}

ScopedStopHandler::~ScopedStopHandler() {
  absl::MutexLock lock(&Handler().mu);
  Handler().on_signal = nullptr;
}

}  // namespace dt
