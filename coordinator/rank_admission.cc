#include "coordinator/rank_admission.h"

#include "absl/strings/str_cat.h"

namespace dt {

absl::Status RankAdmission::Admit(int64_t ranks, const std::string& what) {
  if (ranks_.TryCharge(ranks)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "dtcoord serves at most ", limit(), " ranks at once (dtcoord --max-ranks); runs not yet ended hold ", admitted(),
      " and ", what, " asks for ", ranks,
      ": wait for a run to end, cancel one (dtctl list, dtctl cancel), or restart dtcoord with a larger --max-ranks"));
}

}  // namespace dt
