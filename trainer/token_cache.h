// The tokenized dataset as one file that every rank memory-maps: written once by rank 0 (through
// a coordinator barrier), named after what it was made from, so a changed dataset or tokenizer
// makes a new one. Tokens of all documents, each followed by the EOS id. No torch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dt {

class Gpt2Tokenizer;

// "tokens-<hash>.bin": the hash covers the dataset's path, size, mtime and the tokenizer.
absl::StatusOr<std::string> TokenCacheName(const std::string& dataset_path, const std::string& tokenizer_fingerprint);

// Tokenizes `dataset_path` and writes the cache atomically to `cache_path`.
absl::Status BuildTokenCache(const std::string& dataset_path, Gpt2Tokenizer& tokenizer, const std::string& cache_path);

class TokenCache {
 public:
  static absl::StatusOr<std::unique_ptr<TokenCache>> Open(const std::string& path);
  ~TokenCache();
  int64_t size() const { return count_; }
  int32_t operator[](int64_t i) const { return tokens_[i]; }
  const uint16_t* data() const { return tokens_; }

 private:
  TokenCache() = default;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace dt
