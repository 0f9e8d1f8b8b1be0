#include "coordinator/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/log.h"

namespace dt {

absl::StatusOr<std::string> LoadOrCreateAdminToken(const std::string& state_dir) {
  std::string path = JoinPath(state_dir, "admin.token");
  absl::StatusOr<std::string> existing = ReadFile(path);
  if (existing.ok()) {
    std::string token(absl::StripAsciiWhitespace(*existing));
    if (token.size() < 32) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " holds no valid token (too short); delete it to have a new one generated"));
    }
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      DT_LOG(Warning) << path << " is readable by other users; chmod 600 it";
    }
    return token;
  }
  std::string token = absl::StrCat("dt_admin_", RandomHex(24));
  if (absl::Status s = WriteFileAtomic(path, token + "\n", 0600); !s.ok()) return s;
  DT_LOG(Info) << "wrote a new admin token to " << path << " (mode 0600)";
  return token;
}

Authenticator::Authenticator(std::string admin_token, const Coordinator* coordinator)
    : admin_sha256_(Sha256Hex(admin_token)), coordinator_(coordinator) {}

absl::StatusOr<Principal> Authenticator::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing 'authorization: Bearer <token>' metadata (dtctl reads DT_TOKEN, --token-file or "
        "~/.dt/coord/admin.token; trainers use DT_RUN_TOKEN)");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWithIgnoreCase(value, "bearer ")) {
    return absl::UnauthenticatedError("the authorization metadata must be 'Bearer <token>'");
  }
  return AuthenticateToken(value.substr(7));
}

absl::StatusOr<Principal> Authenticator::AuthenticateToken(absl::string_view token) const {
  token = absl::StripAsciiWhitespace(token);
  if (token.empty() || token.size() > 256) {
    return absl::UnauthenticatedError("the bearer token is empty or too long");
  }
  std::string digest = Sha256Hex(token);
  if (CRYPTO_memcmp(digest.data(), admin_sha256_.data(), digest.size()) == 0) {
    return Principal{true, ""};
  }
  if (std::optional<std::string> run = coordinator_->RunForTokenDigest(digest)) {
    return Principal{false, *run};
  }
  return absl::UnauthenticatedError(
      "unknown token: it is neither the admin token nor a run token "
      "this coordinator issued");
}

}  // namespace dt
