#include "common/data_dir.h"

#include <unistd.h>

#include <vector>

#include "common/fs.h"
#include "common/subprocess.h"

namespace dt {
namespace {

// <dir of this executable>/../share/dt/data (installed), <dir of this executable>/../../data
// (build/bin of a source tree), and the source tree this binary was built from.
std::vector<std::string> DataDirCandidates() {
  std::string exe = ExecutableDir();
  std::vector<std::string> out = {JoinPath(exe, "../share/dt/data"), JoinPath(exe, "../../data")};
#ifdef DT_SOURCE_DATA_DIR
  out.push_back(DT_SOURCE_DATA_DIR);
#endif
  return out;
}

}  // namespace

std::optional<std::string> FindDtPythonDir() {
  std::string exe = ExecutableDir();
  for (const std::string& dir : {JoinPath(exe, "../share/dt/python"), JoinPath(exe, "../python")}) {
    if (::access(JoinPath(dir, "dt/__init__.py").c_str(), R_OK) == 0 &&
        ::access(JoinPath(dir, "dt/v1/checkpoint_pb2.py").c_str(), R_OK) == 0) {
      return RealPath(dir).value_or(dir);
    }
  }
  return std::nullopt;
}

std::optional<std::string> FindDefaultTokenizerDir() {
  for (const std::string& dir : DataDirCandidates()) {
    std::string gpt2 = JoinPath(dir, "gpt2");
    if (::access(JoinPath(gpt2, "encoder.json").c_str(), R_OK) == 0 &&
        ::access(JoinPath(gpt2, "vocab.bpe").c_str(), R_OK) == 0) {
      return RealPath(gpt2).value_or(gpt2);
    }
  }
  return std::nullopt;
}

}  // namespace dt
