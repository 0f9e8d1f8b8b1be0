// Mixed precision for dttrainer's forward passes (--precision bf16): autocast runs the matrix
// products and attention in bfloat16 while the weights, gradients and AdamW state stay fp32 (the
// master copy). bf16 keeps fp32's exponent range, so no loss scaling is needed, unlike fp16.
#pragma once

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"

namespace dt {

enum class Precision { kFp32, kBf16 };

// "fp32" or "bf16"; INVALID_ARGUMENT names the value and the choices.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);
const char* PrecisionName(Precision precision);

// Autocast to bfloat16 on `device`'s type for this scope (nothing for kFp32). Scopes nest; the
// outermost one's end drops autocast's cache of cast weights, which the next step's optimizer
// changes. LibTorch 1.13 (Debian) and 2.x name the calls differently; both are handled here.
class AutocastScope {
 public:
  AutocastScope(torch::Device device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  bool was_enabled_ = false;
  c10::DeviceType type_;
  at::ScalarType was_dtype_ = at::kFloat;
};

}  // namespace dt
