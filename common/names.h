// Validation of user-supplied names and identifiers. Each returns INVALID_ARGUMENT with a message
// that names the field, the offending value (escaped) and the rule it broke.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace dt {

// Experiment names become directory names: non-empty, ≤128 characters, valid UTF-8, no '/',
// no "..", not ".", no NUL or other control characters, no leading '-' or whitespace at either end.
absl::Status ValidateExperimentName(absl::string_view name);

// Barrier names, node names, metric names: non-empty, ≤128 characters, no control characters.
absl::Status ValidateLabel(absl::string_view field, absl::string_view value);

// One line of text: no control character (a line break, ESC, ...), e.g. a value that lands in a
// batch script's #SBATCH line. Empty is fine.
absl::Status ValidateSingleLine(absl::string_view field, absl::string_view value);

// Scheduler node names, which dtctl passes to scontrol (ExcNodeList, show node): ≤128 characters
// of [A-Za-z0-9._-], starting with a letter or digit.
absl::Status ValidateNodeName(absl::string_view node);

// Run ids look like "r-" followed by 16 lower-case hex digits.
absl::Status ValidateRunId(absl::string_view run_id);

// Store keys: non-empty, ≤512 bytes (any bytes, as c10d allows).
absl::Status ValidateStoreKey(absl::string_view key);

// An absolute, normalised-enough path: starts with '/', ≤4096 bytes, no NUL, no ".." component.
absl::Status ValidateAbsolutePath(absl::string_view field, absl::string_view path);

// Metric names: ≤128 chars of [A-Za-z0-9_./-], starting with a letter or '_'.
absl::Status ValidateMetricName(absl::string_view name);

// Scheduler job ids, which dtctl passes to scancel/squeue: Slurm's "123", "123_4" or "123+1";
// the local launcher's "local:<pid>".
absl::Status ValidateSlurmJobId(absl::string_view id);
absl::Status ValidateLocalJobId(absl::string_view id);

// A listening or connecting address "HOST:PORT" ("[V6]:PORT" for IPv6): a host and a port of
// 0..65535 (1..65535 unless `port_zero_ok`, which means "any free port" to a listener).
// INVALID_ARGUMENT naming `flag` and what was wrong, with an example.
absl::Status ValidateHostPort(absl::string_view flag, absl::string_view address, bool port_zero_ok);

// A printable, bounded rendering of user input for error messages.
std::string Quote(absl::string_view value);

}  // namespace dt
