#include "common/data_dir.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/subprocess.h"

namespace dt {

std::vector<std::string> DataDirCandidates() {
  std::string exe = ExecutableDir();
  std::vector<std::string> out = {JoinPath(exe, "../share/dt/data"), JoinPath(exe, "../../data")};
#ifdef DT_SOURCE_DATA_DIR
  out.push_back(DT_SOURCE_DATA_DIR);
#endif
  return out;
}

std::optional<std::string> FindDefaultTokenizerDir() {
  for (const std::string& dir : DataDirCandidates()) {
    std::string gpt2 = JoinPath(dir, "gpt2");
    if (::access(JoinPath(gpt2, "encoder.json").c_str(), R_OK) == 0 &&
        ::access(JoinPath(gpt2, "vocab.bpe").c_str(), R_OK) == 0) {
      char resolved[4096];
      return ::realpath(gpt2.c_str(), resolved) != nullptr ? std::string(resolved) : gpt2;
    }
  }
  return std::nullopt;
}

}  // namespace dt
