#include "trainer/device_preflight.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dt {
namespace {

// At least this many multiplies, over at least this long: a device slowed by a neighbour must
// show it, and a scheduler lets a freshly woken process run a burst of a few milliseconds
// uncontended (five multiplies alone fit in one, and then read healthy).
constexpr int kRepetitions = 5;
constexpr absl::Duration kMeasureAtLeast = absl::Milliseconds(100);
constexpr int kMaxRepetitions = 1000;

void Synchronize(const torch::Device& device) {
  // A CUDA kernel runs asynchronously: reading one element waits for it, on any device type.
  if (device.is_cuda()) (void)torch::zeros({1}, torch::TensorOptions().device(device)).cpu();
}

std::string DeviceName(const torch::Device& device) {
  if (device.is_cpu()) return absl::StrCat("cpu (", torch::get_num_threads(), " thread(s))");
  return device.str();
}

// Big enough to take milliseconds on a healthy device of its kind, small enough to cost little:
// order 512 is ~0.27 GFLOP (a few ms on one CPU core), 8192 ~1.1 TFLOP (a few ms on a GPU).
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
    torch::Tensor c = torch::mm(a, b);  // warm-up: kernels loaded, memory allocated
    Synchronize(device);
    std::vector<double> seconds;
    absl::Time measure_until = absl::Now() + kMeasureAtLeast;
    for (int k = 0; k < kMaxRepetitions && (k < kRepetitions || absl::Now() < measure_until); ++k) {
      absl::Time t0 = absl::Now();
      c = torch::mm(a, b);
      Synchronize(device);
      seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
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
