#include "trainer/device_preflight.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dt {
namespace {

// A rank's figure is the median, over samples, of a sample's time per multiply. Each sample runs
// multiplies back to back for at least kSampleAtLeast: a scheduler lets a freshly woken process run
// uncontended for a slice of a few milliseconds, and a sample shorter than a slice reads a node
// shared with busy neighbours as healthy (a 1.5 ms multiply did, 4x slower beside them). At least
// kSamples samples, over at least kMeasureAtLeast.
constexpr int kSamples = 5;
constexpr absl::Duration kSampleAtLeast = absl::Milliseconds(10);
constexpr absl::Duration kMeasureAtLeast = absl::Milliseconds(100);
constexpr int kMaxSamples = 100;
constexpr int kMaxMultipliesPerSample = 10'000;

void Synchronize(const torch::Device& device) {
  // A CUDA kernel runs asynchronously: reading one element waits for it, on any device type.
  if (device.is_cuda()) (void)torch::zeros({1}, torch::TensorOptions().device(device)).cpu();
}

// How many multiplies fill a sample of kSampleAtLeast, from the fastest of three timed alone (the
// first also loads the kernels and allocates `c`; a multiply slowed by a neighbour makes samples
// shorter, never a slow device look fast).
int MultipliesPerSample(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, const torch::Device& device) {
  absl::Duration fastest = absl::InfiniteDuration();
  for (int k = 0; k < 3; ++k) {
    absl::Time t0 = absl::Now();
    c = torch::mm(a, b);
    Synchronize(device);
    fastest = std::min(fastest, absl::Now() - t0);
  }
  if (fastest <= absl::ZeroDuration()) return kMaxMultipliesPerSample;
  double fit = std::ceil(absl::FDivDuration(kSampleAtLeast, fastest));
  return static_cast<int>(std::clamp(fit, 1.0, static_cast<double>(kMaxMultipliesPerSample)));
}

std::string DeviceName(const torch::Device& device) {
  if (device.is_cpu()) return absl::StrCat("cpu (", torch::get_num_threads(), " thread(s))");
  return device.str();
}

// Big enough to take milliseconds on a healthy device of its kind, small enough to cost little:
// order 512 is ~0.27 GFLOP (1-6 ms on one CPU core), 8192 ~1.1 TFLOP (a few ms on a GPU).
int64_t MatrixOrder(const torch::Device& device) { return device.is_cuda() ? 8192 : 512; }

}  // namespace

v1::DevicePreflight RunDevicePreflight(CommGroup& group, const torch::Device& device) {
  v1::DevicePreflight out;
  out.set_device(DeviceName(device));
  const int64_t n = MatrixOrder(device);
  out.set_matmul_size(static_cast<int32_t>(n));
  try {
    torch::NoGradGuard no_grad;
    auto options = torch::TensorOptions().device(device).dtype(torch::kFloat);
    // Fixed inputs: the global random generator is left as the seed set it.
    torch::Tensor a = torch::linspace(-1, 1, n * n, options).reshape({n, n});
    torch::Tensor b = a.t().contiguous();
    torch::Tensor c;
    const int per_sample = MultipliesPerSample(a, b, c, device);
    std::vector<double> seconds;
    absl::Time measure_until = absl::Now() + kMeasureAtLeast;
    for (int k = 0; k < kMaxSamples && (k < kSamples || absl::Now() < measure_until); ++k) {
      absl::Time t0 = absl::Now();
      for (int m = 0; m < per_sample; ++m) c = torch::mm(a, b);
      Synchronize(device);
      seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0) / per_sample);
    }
    std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
    out.set_matmul_seconds(seconds[seconds.size() / 2]);
    if (!std::isfinite(c.sum().item<float>())) {
      out.set_error("a matrix multiply of finite inputs gave a non-finite result");
      return out;
    }
  } catch (const c10::Error& e) {
    out.set_error(e.what_without_backtrace());
    return out;
  } catch (const std::exception& e) {
    out.set_error(e.what());
    return out;
  }
  std::vector<torch::Tensor> t = {torch::ones({1 << 18}, torch::TensorOptions().device(device))};
  absl::Time t0 = absl::Now();
  group.allreduce(t)->wait();
  out.set_allreduce_seconds(absl::ToDoubleSeconds(absl::Now() - t0));
  return out;
}

}  // namespace dt
