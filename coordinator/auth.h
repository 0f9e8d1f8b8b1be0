// Bearer-token authentication. The admin token lives in <state-dir>/admin.token (mode 0600,
// created on first start); run tokens are issued by SubmitRun and known only by their SHA-256.
// Tokens are compared in constant time and never logged.
#pragma once

#include <string>

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace dt {

// Reads <state_dir>/admin.token, creating it (0600) with a fresh token if it does not exist.
absl::StatusOr<std::string> LoadOrCreateAdminToken(const std::string& state_dir);

class Authenticator {
 public:
  Authenticator(std::string admin_token, const Coordinator* coordinator);

  // UNAUTHENTICATED when the `authorization: Bearer <token>` metadata is missing, malformed, or
  // names no token the coordinator issued.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context) const;
  // The token itself (the web console's login form and its Authorization header): UNAUTHENTICATED
  // when it is empty, too long, or not a token the coordinator issued.
  absl::StatusOr<Principal> AuthenticateToken(absl::string_view token) const;

 private:
  std::string admin_sha256_;
  const Coordinator* coordinator_;
};

}  // namespace dt
