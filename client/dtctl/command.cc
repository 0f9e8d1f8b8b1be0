#include "client/dtctl/command.h"

#include <cstdlib>
#include <iostream>

#include "absl/time/time.h"
#include "common/fs.h"
#include "common/utf8.h"

namespace dt::ctl {

int Fail(const Global& g, const absl::Status& s, const std::string& what) {
  // A coordinator's message may quote what a run sent (a failure's text): never raw to a terminal.
  std::string message = PrintableForTerminal(s.message());
  if (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded) {
    std::cerr << "dtctl: cannot reach the coordinator at " << g.coordinator << " (" << message
              << "); is dtcoord running? set --coordinator or DT_COORDINATOR\n";
    return kUnreachable;
  }
  if (s.code() == absl::StatusCode::kUnauthenticated || s.code() == absl::StatusCode::kPermissionDenied) {
    std::cerr << "dtctl: " << what << ": " << message
              << " (pass --token-file, or set DT_TOKEN to the coordinator's admin token)\n";
    return kFailed;
  }
  std::cerr << "dtctl: " << what << ": " << message << "\n";
  return kFailed;
}

int Connect(Global& g) {
  std::string default_file;
  if (const char* home = std::getenv("HOME"); home != nullptr) default_file = JoinPath(home, ".dt/coord/admin.token");
  absl::StatusOr<std::string> token =
      g.token_file.empty() ? ResolveToken("", "DT_TOKEN", default_file) : ResolveToken("", nullptr, g.token_file);
  if (!token.ok()) {
    std::cerr << "dtctl: " << token.status().message() << "\n";
    return kUsage;
  }
  absl::StatusOr<std::shared_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect(g.coordinator, *token, g.tls_ca);
  if (!client.ok()) {
    std::cerr << "dtctl: " << client.status().message() << "\n";
    return kUsage;
  }
  if (absl::Status s = (*client)->WaitConnected(absl::Seconds(5)); !s.ok()) {
    std::cerr << "dtctl: " << s.message() << "\n";
    return kUnreachable;
  }
  g.client = *client;
  return kOk;
}

absl::StatusOr<v1::Run> GetRun(Global& g, const std::string& run_id) {
  v1::GetRunRequest req;
  req.set_run_id(run_id);
  return Call(*g.client, &v1::RunService::Stub::GetRun, g.client->runs(), req, absl::Seconds(30));
}

void PrintJson(const nlohmann::json& j) { std::cout << j.dump(2) << "\n"; }

}  // namespace dt::ctl
