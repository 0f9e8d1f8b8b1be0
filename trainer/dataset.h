// Training text from a dataset file, rendered as the seed guides do. No torch.
//   .json   an array of Alpaca records {instruction, input?, output}
//   .jsonl  one object per line: {text} or an Alpaca record
//   .txt    plain text, one document
// Malformed input is INVALID_ARGUMENT naming the file and the record or line.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dt {

// The Alpaca prompt template (with the "### Input:" section only when `input` is not empty).
std::string RenderAlpaca(const std::string& instruction, const std::string& input, const std::string& output);

absl::StatusOr<std::vector<std::string>> LoadDocuments(const std::string& path);
// The same from the file's content; `path` picks the format by its ending and names it in messages.
absl::StatusOr<std::vector<std::string>> ParseDocuments(const std::string& path, std::string content);

}  // namespace dt
