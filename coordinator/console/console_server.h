// dtcoord's read-only web console over HTTP (CivetWeb, the server prometheus-cpp also runs on):
// the pages compiled into the binary (console/web/), the JSON API of console_api.h, and sign-in.
//
//   GET  /                 the console (signed in), or a redirect to /login
//   GET  /login            the sign-in form; POST /login with token=… sets the session cookie
//   POST /logout           ends the session
//   GET  /static/…         the page's script, style sheet and icon
//   GET  /api/v1/…         the API: the session cookie or `Authorization: Bearer <token>`
//
// Off unless --http-listen is given, and only on a loopback address: the console takes tokens, and
// the CivetWeb of Debian 12 cannot serve TLS (built for OpenSSL 1.1's API, it calls a function
// OpenSSL 3 no longer has and crashes on the first HTTPS request), so a token would cross the
// network in the clear. From another machine, reach it through an SSH tunnel.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth.h"
#include "coordinator/console/console_api.h"
#include "coordinator/console/console_sessions.h"

class CivetServer;

namespace dt {

struct ConsoleOptions {
  std::string listen;  // HOST:PORT on a loopback address (port 0: any free port)
  int threads = 8;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);

// INVALID_ARGUMENT unless `listen` is HOST:PORT on a loopback address (saying why, and the SSH
// tunnel to use instead).
absl::Status ValidateConsoleListen(const std::string& listen);

class ConsoleServer {
 public:
  //   INVALID_ARGUMENT     a malformed address, or one that is not loopback
  //   UNAVAILABLE          the address cannot be bound
  static absl::StatusOr<std::unique_ptr<ConsoleServer>> Start(const ConsoleOptions& options, Coordinator* coordinator,
                                                              const Authenticator* auth, WandbRunsOf wandb_runs);
  ~ConsoleServer();
  ConsoleServer(const ConsoleServer&) = delete;
  ConsoleServer& operator=(const ConsoleServer&) = delete;

  // "host:port" actually bound.
  const std::string& address() const { return address_; }
  // "http://host:port/".
  std::string url() const;

  // Stops serving (waits for requests in flight). Once; the destructor does it otherwise.
  void Stop();

 private:
  class Handler;
  ConsoleServer() = default;

  std::string address_;
  std::unique_ptr<ConsoleApi> api_;
  std::unique_ptr<ConsoleSessions> sessions_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetServer> server_;
};

}  // namespace dt
