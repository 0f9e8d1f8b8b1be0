// Human durations on command lines and in messages ("500ms", "30s", "10m", "1h30m"), and the
// monotonic clock that processes of one machine compare.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dt {

// Parses a positive duration with a unit ("500ms", "30s", "10m", "2h", "1m30s"). A bare number
// is refused, since "30" could mean seconds or milliseconds. INVALID_ARGUMENT names `flag`.
absl::StatusOr<absl::Duration> ParsePositiveDuration(absl::string_view flag, absl::string_view text);

int64_t ToMillis(absl::Duration d);

// A timeout as the whole milliseconds a request carries, rounded up: a wait never ends before its
// timeout. (Truncated, what was left of a 300 ms wait after a 0.3 ms look went as 299 ms, and the
// wait ended at 299.9 ms.) Infinite stays infinite (INT64_MAX); zero stays zero.
int64_t TimeoutMillis(absl::Duration timeout);

// Nanoseconds on CLOCK_MONOTONIC (std::chrono::steady_clock), which every process of the machine
// shares: comparable across processes, never stepped by the wall clock.
int64_t MonotonicNowNs();

}  // namespace dt
