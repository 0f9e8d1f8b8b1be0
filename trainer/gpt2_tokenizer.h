// GPT-2 byte-level BPE: the same ids as the reference tokenizer (OpenAI's encoder.py / tiktoken
// "gpt2"). Reads encoder.json + vocab.bpe, or Hugging Face's vocab.json + merges.txt. No torch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace re2 {
class RE2;
}

namespace dt {

class Gpt2Tokenizer {
 public:
  // NOT_FOUND naming the directory and the files it looked for; INVALID_ARGUMENT for malformed
  // files (naming the file and line).
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Load(const std::string& dir);
  ~Gpt2Tokenizer();

  // Not thread-safe (the word cache): one tokenizer per thread.
  std::vector<int32_t> Encode(absl::string_view text);
  // INVALID_ARGUMENT for an id outside the vocabulary.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;

  int32_t eos_id() const { return eos_id_; }  // "<|endoftext|>"
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  // SHA-256 of the vocabulary and merges: identifies the tokenizer in token caches.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Gpt2Tokenizer();
  void EncodeWord(absl::string_view word, std::vector<int32_t>* out);

  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  int32_t byte_ids_[256];           // id of each single byte's token
  uint8_t byte_of_codepoint_[324];  // inverse of the byte→unicode map (code points < 324)
  // (left id << 32 | right id) → (rank << 32 | merged id)
  absl::flat_hash_map<uint64_t, uint64_t> merges_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
  std::unique_ptr<re2::RE2> pattern_;
  int32_t eos_id_ = -1;
  std::string fingerprint_;
};

}  // namespace dt
