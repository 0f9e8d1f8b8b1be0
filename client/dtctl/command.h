// What every dtctl command shares: the global flags and the connection they make, the exit codes,
// and how a failed call is said.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace dt::ctl {

// Exit codes: 0 ok, 1 the operation failed (the message says why), 2 usage error, 3 the
// coordinator cannot be reached, 5 exclude-failed-nodes requeued the job (the batch script ends).
inline constexpr int kOk = 0;
inline constexpr int kFailed = 1;
inline constexpr int kUsage = 2;
inline constexpr int kUnreachable = 3;
inline constexpr int kJobRequeued = 5;

struct Global {
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  std::string output = "table";
  std::shared_ptr<CoordinatorClient> client;
};

// Says `s` on stderr as the failure of `what`, with what to do; returns the exit code.
int Fail(const Global& g, const absl::Status& s, const std::string& what);
// Reads the token and connects to the coordinator (g.client); an exit code other than kOk when it cannot.
int Connect(Global& g);
absl::StatusOr<v1::Run> GetRun(Global& g, const std::string& run_id);
void PrintJson(const nlohmann::json& j);

}  // namespace dt::ctl
