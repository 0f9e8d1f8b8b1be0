#include "common/crypto.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace dt {

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) {
    throw std::runtime_error("OpenSSL RAND_bytes failed");
  }
  return absl::BytesToHexString(raw);
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr); }

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(const void* data, size_t size) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size); }

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), len));
}

std::string Sha1Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha1(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), len));
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 hash;
  hash.Update(data.data(), data.size());
  return hash.HexDigest();
}

absl::StatusOr<std::string> Sha256Fd(int fd, const std::string& path) {
  Sha256 hash;
  std::vector<char> buffer(4 << 20);
  while (true) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    hash.Update(buffer.data(), static_cast<size_t>(n));
  }
  return hash.HexDigest();
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  absl::StatusOr<std::string> digest = Sha256Fd(fd, path);
  ::close(fd);
  return digest;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Compare digests so the time depends on neither input's length nor content.
  std::string da = Sha256Hex(a);
  std::string db = Sha256Hex(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

}  // namespace dt
