// Reading the process environment.
#pragma once

#include <string>

namespace dt {

// The variable's value; empty when unset.
std::string Env(const char* name);
// The variable as an integer; `fallback` when unset or not a number.
int EnvInt(const char* name, int fallback);

}  // namespace dt
