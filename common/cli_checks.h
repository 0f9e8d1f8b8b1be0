// CLI11 checks whose messages say what was wrong in words ("must be ≥ 1, got 0") instead of the
// validator's own text (CLI::PositiveNumber prints a range up to 1.8e308). Header-only: for the
// binaries that use CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <regex>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/names.h"
#include "common/procs_per_node.h"

namespace dt {

// --nproc-per-node: a count, or gpu|cpu|auto (common/procs_per_node.h), with its reasons.
inline CLI::Validator ProcsPerNodeValue() {
  return CLI::Validator(
      [](std::string& text) {
        absl::StatusOr<ProcsPerNode> parsed = ParseProcsPerNode(text, "");  // CLI11 names the flag
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "COUNT|gpu|cpu|auto");
}

// A whole number ≥ `min`. CLI11 prefixes the option's name: "--nodes: must be ≥ 1, got 0".
inline CLI::Validator AtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& input) -> std::string {
        int64_t value = 0;
        if (!absl::SimpleAtoi(input, &value)) return absl::StrCat("must be a whole number, got \"", input, "\"");
        if (value < min) return absl::StrCat("must be ≥ ", min, ", got ", input);
        return "";
      },
      absl::StrCat("≥ ", min));
}

// A whole number in min..max: "--max-restarts: must be in 0..1000, got 5000".
inline CLI::Validator InRange(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& input) -> std::string {
        int64_t value = 0;
        if (!absl::SimpleAtoi(input, &value)) return absl::StrCat("must be a whole number, got \"", input, "\"");
        if (value < min || value > max) return absl::StrCat("must be in ", min, "..", max, ", got ", input);
        return "";
      },
      absl::StrCat(min, "..", max));
}

// A number (fractions allowed) ≥ `min`: "--preflight-slowdown: must be a number ≥ 1.5, got 1".
inline CLI::Validator NumberAtLeast(double min) {
  return CLI::Validator(
      [min](std::string& input) -> std::string {
        double value = 0;
        if (!absl::SimpleAtod(input, &value) || !(value == value)) {
          return absl::StrCat("must be a number, got \"", input, "\"");
        }
        if (value < min) return absl::StrCat("must be a number ≥ ", min, ", got ", input);
        return "";
      },
      absl::StrCat("≥ ", min));
}

// HOST:PORT (see ValidateHostPort), or `off_word` when it is not empty: "--listen: \"x\" is not
// HOST:PORT (e.g. …)".
inline CLI::Validator HostPort(bool port_zero_ok, std::string off_word = "") {
  return CLI::Validator(
      [port_zero_ok, off_word](std::string& input) -> std::string {
        if (!off_word.empty() && input == off_word) return "";
        absl::Status s = ValidateHostPort("", input, port_zero_ok);
        return s.ok() ? "" : std::string(absl::StripPrefix(s.message(), " "));
      },
      "HOST:PORT");
}

// CLI11's own wording of a parse error, in ours.
inline std::string DescribeParseError(const std::string& what) {
  static const std::pair<std::regex, std::string> kRewrites[] = {
      {std::regex(R"(^(-[-\w]+): \d+ required \S+ missing$)"), "$1 needs a value"},
      {std::regex(R"(^Could not convert: (-[-\w]+) = (.*)$)"), "$1: \"$2\" is not a value it takes"},
      {std::regex(R"(^The following arguments? (was|were) not expected: (.*)$)"), "unknown argument $2"},
      {std::regex(R"(^(-[-\w]+): At Most \d+ required but received \d+$)"), "$1 is given more than once"},
      {std::regex(R"(^(\w+) is required$)"), "the $1 argument is missing"},
  };
  for (const auto& [pattern, replacement] : kRewrites) {
    if (std::regex_match(what, pattern)) return std::regex_replace(what, pattern, replacement);
  }
  return what;
}

// Ends a failed parse: --help and --version print and return 0; an error is said on stderr as
// "<program>: <what was wrong>" with a pointer to --help, and returns `usage_code`.
inline int ExitOnParseError(CLI::App& app, const CLI::ParseError& e, const std::string& program, int usage_code = 2) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  std::cerr << program << ": " << DescribeParseError(e.what()) << " (see " << program << " --help)\n";
  return usage_code;
}

}  // namespace dt
