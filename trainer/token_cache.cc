#include "trainer/token_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "trainer/dataset.h"
#include "trainer/gpt2_tokenizer.h"

namespace dt {
namespace {

constexpr char kMagic[8] = {'D', 'T', 'T', 'O', 'K', '1', '\0', '\0'};
struct Header {
  char magic[8];
  uint64_t count;
};

}  // namespace

absl::StatusOr<std::string> TokenCacheName(const std::string& dataset_path, const std::string& tokenizer_fingerprint) {
  struct stat st;
  if (::stat(dataset_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("dataset ", dataset_path, ": ", std::strerror(errno)));
  }
  std::string id = absl::StrCat(dataset_path, "|", st.st_size, "|", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "|",
                                tokenizer_fingerprint, "|v1");
  return absl::StrCat("tokens-", Sha256Hex(id).substr(0, 16), ".bin");
}

absl::Status BuildTokenCache(const std::string& dataset_path, Gpt2Tokenizer& tokenizer, const std::string& cache_path) {
  absl::StatusOr<std::vector<std::string>> docs = LoadDocuments(dataset_path);
  if (!docs.ok()) return docs.status();
  if (tokenizer.vocab_size() > 65536 || tokenizer.eos_id() < 0) {
    return absl::FailedPreconditionError("the token cache needs a vocabulary of at most 65,536 with <|endoftext|>");
  }
  std::string body(sizeof(Header), '\0');
  std::vector<int32_t> ids;
  for (const std::string& doc : *docs) {
    ids = tokenizer.Encode(doc);
    ids.push_back(tokenizer.eos_id());
    for (int32_t id : ids) {
      uint16_t t = static_cast<uint16_t>(id);
      body.append(reinterpret_cast<const char*>(&t), sizeof(t));
    }
  }
  Header h;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.count = (body.size() - sizeof(Header)) / sizeof(uint16_t);
  std::memcpy(body.data(), &h, sizeof(h));
  return WriteFileAtomic(cache_path, body);
}

absl::StatusOr<std::unique_ptr<TokenCache>> TokenCache::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("token cache ", path, ": ", std::strerror(errno)));
  struct stat st;
  ::fstat(fd, &st);
  if (st.st_size < static_cast<off_t>(sizeof(Header))) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("token cache ", path, " is truncated"));
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  std::unique_ptr<TokenCache> cache(new TokenCache());
  cache->map_ = map;
  cache->map_bytes_ = static_cast<size_t>(st.st_size);
  Header h;
  std::memcpy(&h, map, sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 ||
      sizeof(Header) + h.count * sizeof(uint16_t) != cache->map_bytes_) {
    return absl::DataLossError(absl::StrCat("token cache ", path, " is corrupt; delete it to rebuild"));
  }
  cache->count_ = static_cast<int64_t>(h.count);
  cache->tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + sizeof(Header));
  return cache;
}

TokenCache::~TokenCache() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

}  // namespace dt
