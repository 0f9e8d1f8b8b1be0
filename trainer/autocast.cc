#include "trainer/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"

namespace dt {
namespace {

// LibTorch 2.4 made autocast's switches per device type; 1.13 has one pair per kind of device.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool Enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
void SetEnabled(c10::DeviceType type, bool on) { at::autocast::set_autocast_enabled(type, on); }
at::ScalarType Dtype(c10::DeviceType type) { return at::autocast::get_autocast_dtype(type); }
void SetDtype(c10::DeviceType type, at::ScalarType dtype) { at::autocast::set_autocast_dtype(type, dtype); }
#else
bool Enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void SetEnabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
at::ScalarType Dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
void SetDtype(c10::DeviceType type, at::ScalarType dtype) {
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}
#endif

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("--precision \"", name,
                   "\" is not offered: use fp32 or bf16 (not fp16, which needs loss scaling; bf16 does not)"));
}

const char* PrecisionName(Precision precision) { return precision == Precision::kBf16 ? "bf16" : "fp32"; }

AutocastScope::AutocastScope(torch::Device device, Precision precision) : type_(device.type()) {
  if (precision != Precision::kBf16) return;
  active_ = true;
  was_enabled_ = Enabled(type_);
  was_dtype_ = Dtype(type_);
  SetEnabled(type_, true);
  SetDtype(type_, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetEnabled(type_, was_enabled_);
  SetDtype(type_, was_dtype_);
}

}  // namespace dt
