#include "client/coordinator_client.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/limits.h"
#include "common/names.h"

namespace dt {

absl::StatusOr<std::string> ResolveToken(const std::string& flag_value, const char* env_var, const std::string& file) {
  if (!flag_value.empty()) return flag_value;
  if (env_var != nullptr) {
    const char* env = std::getenv(env_var);
    if (env != nullptr && *env != '\0') return std::string(absl::StripAsciiWhitespace(env));
  }
  std::string file_problem;
  if (!file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(file);
    if (text.ok()) {
      std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
      if (!token.empty()) return token;
      file_problem = absl::StrCat("token file ", file, " is empty (its first line should hold the token)");
    } else {
      file_problem = std::string(text.status().message());
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no coordinator token: ", file_problem.empty() ? "" : absl::StrCat(file_problem, "; "),
                   env_var ? absl::StrCat("set ", env_var, " or ") : "",
                   "give a file holding the token (dtcoord writes its admin token to <state-dir>/admin.token)"));
}

absl::StatusOr<std::string> ResolveRunToken(const std::string& token_file) {
  if (!token_file.empty()) return ResolveToken("", nullptr, token_file);
  absl::StatusOr<std::string> token = ResolveToken("", "DT_RUN_TOKEN", "");
  return token.ok() ? token : ResolveToken("", "DT_TOKEN", "");
}

absl::StatusOr<std::shared_ptr<CoordinatorClient>> CoordinatorClient::Connect(const std::string& address,
                                                                              const std::string& token,
                                                                              const std::string& tls_ca_file) {
  ClientOptions options;
  options.address = address;
  options.token = token;
  options.tls_ca_file = tls_ca_file;
  return Connect(options);
}

absl::StatusOr<std::shared_ptr<CoordinatorClient>> CoordinatorClient::Connect(const ClientOptions& options) {
  if (absl::Status s = ValidateHostPort("coordinator address", options.address, /*port_zero_ok=*/false); !s.ok()) {
    return s;
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> roots = ReadFile(options.tls_ca_file);
    if (!roots.ok()) return roots.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *roots;
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a coordinator restart instead of backing off for up to 2 minutes.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1'000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC also uses the "min" backoff as each connection attempt's deadline (grpc/grpc#12830): at
  // 100 ms a handshake with a coordinator that just started, on a busy machine, times out again
  // and again ("tcp handshaker shutdown") and a rank never gets back; much longer and one attempt
  // stuck on a dying server's listening socket holds the rank for that long.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1'000);
  if (options.private_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // No bandwidth-delay probing: its pings ride on small messages (store operations, heartbeats),
  // each costing the peer a wake-up, and the default 64 KiB window already covers dt's largest
  // messages on a cluster's network.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  std::shared_ptr<CoordinatorClient> client(new CoordinatorClient(options));
  client->channel_ = grpc::CreateCustomChannel(options.address, credentials, args);
  client->runs_ = v1::RunService::NewStub(client->channel_);
  client->rendezvous_ = v1::RendezvousService::NewStub(client->channel_);
  client->stacks_ = v1::StacksService::NewStub(client->channel_);
  client->store_ = v1::StoreService::NewStub(client->channel_);
  client->barriers_ = v1::BarrierService::NewStub(client->channel_);
  client->experiments_ = v1::ExperimentService::NewStub(client->channel_);
  client->checkpoints_ = v1::CheckpointService::NewStub(client->channel_);
  client->metrics_ = v1::MetricsService::NewStub(client->channel_);
  return client;
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  if (timeout != absl::InfiniteDuration()) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  }
  return ctx;
}

absl::Status CoordinatorClient::WaitConnected(absl::Duration timeout) const {
  auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  if (channel_->WaitForConnected(deadline)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", options_.address, " within ",
                                             absl::FormatDuration(timeout),
                                             " (is dtcoord running? check --coordinator/DT_COORDINATOR)"));
}

absl::StatusOr<std::vector<v1::MetricRecord>> QueryAllMetrics(CoordinatorClient& client,
                                                              v1::QueryMetricsRequest request, absl::Duration timeout) {
  const int32_t wanted = request.limit();  // 0: all
  std::vector<v1::MetricRecord> out;
  while (true) {
    if (wanted > 0) request.set_limit(wanted - static_cast<int32_t>(out.size()));
    absl::StatusOr<v1::QueryMetricsResponse> page =
        Call(client, &v1::MetricsService::Stub::QueryMetrics, client.metrics(), request, timeout);
    if (!page.ok()) return page.status();
    for (auto& rec : *page->mutable_records()) out.push_back(std::move(rec));
    if (!page->has_next() || (wanted > 0 && static_cast<int32_t>(out.size()) >= wanted)) return out;
    *request.mutable_after() = page->next();
  }
}

}  // namespace dt
