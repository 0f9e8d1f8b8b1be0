// Tokens, ids and checksums through OpenSSL.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dt {

// `bytes` random bytes from OpenSSL's CSPRNG, as lower-case hex (2 × bytes characters).
std::string RandomHex(size_t bytes);

// Lower-case hex SHA-1 of `data` (W&B run ids of the seed guides; not for security).
std::string Sha1Hex(absl::string_view data);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// Lower-case hex SHA-256 of a file's contents, read in large blocks.
absl::StatusOr<std::string> Sha256File(const std::string& path);
// The same from an open descriptor's current offset to its end (`path` only names it in errors).
absl::StatusOr<std::string> Sha256Fd(int fd, const std::string& path);

// Incremental SHA-256 for writers that hash while they write.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  std::string HexDigest();  // finishes the hash

 private:
  void* ctx_;
};

// Equality that takes the same time wherever the inputs differ (for tokens).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dt
