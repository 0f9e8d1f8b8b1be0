#include "coordinator/rank_admission.h"

#include "absl/strings/str_cat.h"

namespace dt {

absl::Status RankAdmission::Refusal(int64_t held, int64_t ranks, const std::string& what) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "dtcoord serves at most ", limit_, " ranks at once (dtcoord --max-ranks); runs not yet ended hold ", held,
      " and ", what, " asks for ", ranks,
      ": wait for a run to end, cancel one (dtctl list, dtctl cancel), or restart dtcoord with a larger --max-ranks"));
}

absl::Status RankAdmission::Admit(int64_t ranks, const std::string& what) {
  int64_t held = admitted_.load(std::memory_order_relaxed);
  do {
    if (held + ranks > limit_) return Refusal(held, ranks, what);
  } while (!admitted_.compare_exchange_weak(held, held + ranks, std::memory_order_relaxed));
  return absl::OkStatus();
}

}  // namespace dt
