// A Chrome trace of a few training steps (Kineto, the format torch.profiler's export_chrome_trace
// writes), so dttrainer's device work can be laid beside a Python program's step for step: which
// kernels, how long, and where the device waits for the host.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dt {

class StepProfiler {
 public:
  // Traces steps [first_step, first_step + steps) into `path`; an empty path traces nothing.
  StepProfiler(std::string path, int64_t first_step, int64_t steps, bool cuda);

  // Before the step: the trace starts at first_step, after the device has finished the steps
  // before it (so their kernels do not spill into the window). A profiler that cannot start (one
  // already running in this process) is said in the status; training goes on.
  absl::Status BeforeStep(int64_t step);
  // After the step: at the window's last step, waits for the device and writes the trace (true:
  // written now). A failed write is said in the status; training goes on.
  absl::StatusOr<bool> AfterStep(int64_t step);

 private:
  void Synchronize() const;

  std::string path_;
  int64_t first_step_;
  int64_t last_step_;
  bool cuda_;
  bool tracing_ = false;
};

}  // namespace dt
