// The dataset readers on arbitrary files of each format: documents or an INVALID_ARGUMENT naming
// the file; never a crash, never an empty success.
#include <cstdint>

#include "absl/strings/match.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "trainer/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256 * 1024) return 0;
  dt::fuzz::FuzzInput in(data, size);
  static const char* const kPaths[] = {"data.json", "data.jsonl", "data.txt"};
  std::string path = kPaths[in.Byte() % 3];
  absl::StatusOr<std::vector<std::string>> docs = dt::ParseDocuments(path, in.Rest());
  if (docs.ok()) {
    dt::fuzz::Check(!docs->empty(), path + ": success with no documents");
    return 0;
  }
  dt::fuzz::CheckRefusal(docs.status(), path);
  dt::fuzz::Check(docs.status().code() == absl::StatusCode::kInvalidArgument,
                  "not INVALID_ARGUMENT: " + docs.status().ToString());
  dt::fuzz::Check(absl::StrContains(docs.status().message(), path), "the message does not name the file");
  return 0;
}
