#include "trainer/step_profiler.h"

#include <set>
#include <utility>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"

namespace dt {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

}  // namespace

StepProfiler::StepProfiler(std::string path, int64_t first_step, int64_t steps, bool cuda)
    : path_(std::move(path)), first_step_(first_step), last_step_(first_step + steps - 1), cuda_(cuda) {}

void StepProfiler::Synchronize() const {
  if (cuda_) torch::cuda::synchronize();
}

absl::Status StepProfiler::BeforeStep(int64_t step) {
  if (path_.empty() || step != first_step_) return absl::OkStatus();
  Synchronize();
  // As torch.profiler does: the activities are prepared (CUPTI set up) before the window opens.
  const ProfilerConfig config(ProfilerState::KINETO);
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  try {
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot trace steps ", first_step_, " to ", last_step_, ": ", e.what()));
  }
  tracing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> StepProfiler::AfterStep(int64_t step) {
  if (!tracing_ || step != last_step_) return false;
  Synchronize();
  tracing_ = false;
  try {
    profiler::disableProfiler()->save(path_);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot write the trace of steps ", first_step_, " to ", last_step_, " to ",
                                            path_, ": ", e.what()));
  }
  return true;
}

}  // namespace dt
