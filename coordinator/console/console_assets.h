// The web console's files (coordinator/console/web/), compiled into dtcoord: the machines it runs
// on may have no internet, and nothing beside the binary needs installing. console_assets.cc is
// generated at build time by cmake/EmbedFiles.cmake.
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace dt {

struct ConsoleAsset {
  const char* name;          // "app.js": the file's name under web/
  const char* content_type;  // "text/javascript; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

// nullptr when there is no such file.
const ConsoleAsset* FindConsoleAsset(absl::string_view name);

}  // namespace dt
