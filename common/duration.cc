#include "common/duration.h"

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace dt {

absl::StatusOr<absl::Duration> ParsePositiveDuration(absl::string_view flag, absl::string_view text) {
  absl::Duration d;
  absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  bool bare_number = !trimmed.empty() && absl::ascii_isdigit(static_cast<unsigned char>(trimmed.back()));
  if (bare_number || !absl::ParseDuration(trimmed, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", Quote(text), " is not a duration: write a number with a unit, e.g. 500ms, 30s, 10m"));
  }
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", Quote(text), " must be positive and finite"));
  }
  return d;
}

int64_t ToMillis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

int64_t TimeoutMillis(absl::Duration timeout) {
  return absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1)));
}

int64_t MonotonicNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace dt
