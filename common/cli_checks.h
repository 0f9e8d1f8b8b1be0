// CLI11 checks whose messages say what was wrong in words ("must be ≥ 1, got 0") instead of the
// validator's own text (CLI::PositiveNumber prints a range up to 1.8e308). Header-only: for the
// binaries that use CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dt {

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

}  // namespace dt
