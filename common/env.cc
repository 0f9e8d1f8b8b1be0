#include "common/env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"

namespace dt {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

int EnvInt(const char* name, int fallback) {
  int v = 0;
  return absl::SimpleAtoi(Env(name), &v) ? v : fallback;
}

}  // namespace dt
