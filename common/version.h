#pragma once

namespace dt {
// Set by CMake from the project version.
inline constexpr char kVersion[] = DT_VERSION;
}  // namespace dt
