// A connection to dtcoord: the channel, the stubs of every service, and call contexts that carry
// the bearer token and a deadline. Used by dttrainer, dtctl, the tests and the benchmarks.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dt/v1/barrier.grpc.pb.h"
#include "dt/v1/checkpoint.grpc.pb.h"
#include "dt/v1/experiment.grpc.pb.h"
#include "dt/v1/metrics.grpc.pb.h"
#include "dt/v1/rendezvous.grpc.pb.h"
#include "dt/v1/runs.grpc.pb.h"
#include "dt/v1/stacks.grpc.pb.h"
#include "dt/v1/store.grpc.pb.h"

namespace dt {

struct ClientOptions {
  std::string address = "127.0.0.1:50051";
  std::string token;        // sent as "authorization: Bearer <token>"
  std::string tls_ca_file;  // PEM roots; empty: plaintext
  // A connection of its own instead of one shared with other channels to the same address
  // (benchmarks that simulate many processes).
  bool private_connection = false;
};

// The token from, in order: `flag_value`, the environment variable `env_var`, the file `file`
// (first line). NOT_FOUND names all three when none has one.
absl::StatusOr<std::string> ResolveToken(const std::string& flag_value, const char* env_var, const std::string& file);

// A rank's token (dttrainer, dtrun): the file `token_file` when given, else $DT_RUN_TOKEN (what
// dtctl submit's launchers set), else $DT_TOKEN (a user's own sbatch script).
absl::StatusOr<std::string> ResolveRunToken(const std::string& token_file);

class CoordinatorClient {
 public:
  static absl::StatusOr<std::shared_ptr<CoordinatorClient>> Connect(const ClientOptions& options);
  // A shared connection to `address` with `token`, over TLS when `tls_ca_file` names PEM roots.
  static absl::StatusOr<std::shared_ptr<CoordinatorClient>> Connect(const std::string& address,
                                                                    const std::string& token,
                                                                    const std::string& tls_ca_file);

  // A context with the token and a deadline `timeout` from now (InfiniteDuration: none).
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;

  // Waits up to `timeout` for the channel to connect; UNAVAILABLE naming the address otherwise.
  absl::Status WaitConnected(absl::Duration timeout) const;

  const std::string& address() const { return options_.address; }
  const std::string& token() const { return options_.token; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  v1::RunService::Stub& runs() { return *runs_; }
  v1::RendezvousService::Stub& rendezvous() { return *rendezvous_; }
  v1::StoreService::Stub& store() { return *store_; }
  v1::BarrierService::Stub& barriers() { return *barriers_; }
  v1::ExperimentService::Stub& experiments() { return *experiments_; }
  v1::CheckpointService::Stub& checkpoints() { return *checkpoints_; }
  v1::MetricsService::Stub& metrics() { return *metrics_; }
  v1::StacksService::Stub& stacks() { return *stacks_; }

 private:
  explicit CoordinatorClient(ClientOptions options) : options_(std::move(options)) {}
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::RunService::Stub> runs_;
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous_;
  std::unique_ptr<v1::StoreService::Stub> store_;
  std::unique_ptr<v1::BarrierService::Stub> barriers_;
  std::unique_ptr<v1::ExperimentService::Stub> experiments_;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
  std::unique_ptr<v1::MetricsService::Stub> metrics_;
  std::unique_ptr<v1::StacksService::Stub> stacks_;
};

// Calls a unary stub method with a fresh context: `Call(client, &Stub::Method, request, timeout)`.
// `wait_for_ready`: see coordinator_client_inl.h.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Call(const CoordinatorClient& client,
                              grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*), Stub& stub,
                              const Request& request, absl::Duration timeout, bool wait_for_ready = false);

// Every stored record `request` selects, page after page (its `after` is advanced; a `limit`
// in it bounds the total). Each page gets `timeout`.
absl::StatusOr<std::vector<v1::MetricRecord>> QueryAllMetrics(CoordinatorClient& client,
                                                              v1::QueryMetricsRequest request, absl::Duration timeout);

}  // namespace dt

#include "client/coordinator_client_inl.h"
