// dtctl's run files (YAML) of any content: the options, or INVALID_ARGUMENT naming the file; never
// a crash or an uncaught yaml-cpp exception.
#include <cstdint>

#include "absl/strings/match.h"
#include "client/dtctl/submit.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string text(reinterpret_cast<const char*>(data), size);
  dt::ctl::SubmitOptions options;
  absl::Status s = dt::ctl::ParseRunFile("run.yaml", text, &options);
  if (s.ok()) {
    dt::fuzz::Check(options.nodes >= 1 && options.nproc_per_node >= 1, "a run file gave a world below 1");
    return 0;
  }
  dt::fuzz::CheckRefusal(s, "run file");
  dt::fuzz::Check(s.code() == absl::StatusCode::kInvalidArgument, "not INVALID_ARGUMENT: " + s.ToString());
  dt::fuzz::Check(absl::StrContains(s.message(), "run file run.yaml"), "the message does not name the file");
  return 0;
}
