#include "coordinator/embedded.h"

#include <stdexcept>

#include "common/fs.h"

namespace dt {

EmbeddedCoordinator::EmbeddedCoordinator(const std::string& state_dir, EmbeddedOptions options) {
  if (absl::Status s = MakeDirs(state_dir); !s.ok()) throw std::runtime_error(std::string(s.message()));
  auto db = StateDb::Open(JoinPath(state_dir, "dtcoord.db"));
  if (!db.ok()) throw std::runtime_error(std::string(db.status().message()));
  db_ = std::move(*db);
  timers_ = std::make_unique<TimerQueue>(RealClock::Get());
  timers_->Start();
  CoordinatorOptions copts;
  copts.timeouts = options.timeouts;
  copts.health_check_period = options.health_check_period;
  coordinator_ = std::make_unique<Coordinator>(copts, RealClock::Get(), timers_.get(), db_.get());
  if (absl::Status s = coordinator_->Load(); !s.ok()) throw std::runtime_error(std::string(s.message()));
  coordinator_->Start();
  auto token = LoadOrCreateAdminToken(state_dir);
  if (!token.ok()) throw std::runtime_error(std::string(token.status().message()));
  admin_token_ = *token;
  auth_ = std::make_unique<Authenticator>(admin_token_, coordinator_.get());
  ServerOptions sopts;
  sopts.listen = "127.0.0.1:0";
  auto server = CoordinatorServer::Start(coordinator_.get(), auth_.get(), sopts);
  if (!server.ok()) throw std::runtime_error(std::string(server.status().message()));
  server_ = std::move(*server);
}

EmbeddedCoordinator::~EmbeddedCoordinator() {
  server_->Shutdown(absl::Seconds(1));
  timers_->Stop();
}

std::shared_ptr<CoordinatorClient> EmbeddedCoordinator::Client(const std::string& token,
                                                               bool private_connection) const {
  ClientOptions o;
  o.address = address();
  o.token = token;
  o.private_connection = private_connection;
  auto c = CoordinatorClient::Connect(o);
  if (!c.ok()) throw std::runtime_error(std::string(c.status().message()));
  return *c;
}

}  // namespace dt
