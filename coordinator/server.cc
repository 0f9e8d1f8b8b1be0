#include "coordinator/server.h"

#include <climits>

#include "absl/strings/match.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/limits.h"
#include "common/log.h"
#include "coordinator/services.h"
#include "coordinator/store_ops.h"
#include "coordinator/tcp_keepalive.h"
#include "coordinator/unparsable_request.h"

namespace dt {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(Coordinator* coordinator,
                                                                            const Authenticator* auth,
                                                                            const ServerOptions& options,
                                                                            RpcObserver* rpc_observer) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert.empty() || !options.tls_key.empty()) {
    if (options.tls_cert.empty() || options.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
    }
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert);
    if (!cert.ok()) return absl::FailedPreconditionError(absl::StrCat("--tls-cert: ", cert.status().message()));
    absl::StatusOr<std::string> key = ReadFile(options.tls_key);
    if (!key.ok()) return absl::FailedPreconditionError(absl::StrCat("--tls-key: ", key.status().message()));
    if (!absl::StrContains(*cert, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", options.tls_cert, " holds no PEM certificate"));
    }
    if (!absl::StrContains(*key, "PRIVATE KEY-----")) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-key ", options.tls_key, " holds no PEM private key"));
    }
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    credentials = grpc::SslServerCredentials(ssl);
  }

  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->coordinator_ = coordinator;
  ServiceDeps deps{coordinator, auth, rpc_observer, &server->waiting_calls_};
  server->services_.push_back(std::make_unique<RunServiceImpl>(deps));
  server->services_.push_back(std::make_unique<RendezvousServiceImpl>(deps));
  auto store = std::make_unique<StoreServiceImpl>(deps, options.store_features.value_or(AllStoreSessionFeatures()));
  server->store_service_ = store.get();
  server->services_.push_back(std::move(store));
  server->services_.push_back(std::make_unique<BarrierServiceImpl>(deps));
  server->services_.push_back(std::make_unique<ExperimentServiceImpl>(deps));
  server->services_.push_back(std::make_unique<CheckpointServiceImpl>(deps));
  server->services_.push_back(std::make_unique<MetricsServiceImpl>(deps));
  server->services_.push_back(std::make_unique<StacksServiceImpl>(deps));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  // Dead peers (a crashed node's open calls) are found by the kernel's TCP keepalive, set on the
  // listening socket below, not by gRPC's pings: gRPC 1.51 cancels and re-arms a connection's
  // keepalive timer on every read, and Debian's build checks each timer against a debug table (a
  // chain walk among every connection's timers). At 98,304 ranks on node streams that was 13% of
  // dtcoord's CPU (42.4-44.1% of a core with pings, 36.2-38.7% without; bench_scale 12288).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  // Clients ping every 30 s, idle or not (client/coordinator_client.cc): accept that.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // No bandwidth-delay probing: its pings cost a wake-up per small message on both sides (server
  // CPU per store operation 11.6 -> 10.1 us at 8 clients, bench_store).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // A second dtcoord on a port one already serves must fail, not share it (gRPC sets SO_REUSEPORT
  // by default, and clients would land on either at random).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<UnparsableRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  for (auto& service : server->services_) builder.RegisterService(service.get());
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen,
                                               ": the port is in use (another dtcoord?) or the address is not this "
                                               "host's; choose another --listen"));
  }
  // A dead peer's connection fails within about a minute: 30 s quiet, then 3 probes 10 s apart, or
  // 20 s of unacknowledged writes.
  if (!absl::StartsWith(options.listen, "unix:")) {
    if (absl::StatusOr<int> set = SetKeepaliveOnListeners(port, TcpKeepalive{}); !set.ok()) {
      DT_LOG(Warning) << "TCP keepalive is off on port " << port << " (" << set.status().message()
                      << "): a crashed peer's connection stays open until a write to it fails";
    }
  }
  std::string host = options.listen.substr(0, options.listen.rfind(':'));
  server->address_ = absl::StrCat(host, ":", port);
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  // A third of the second after which gRPC's callback threads doze (callback_queue_keeper.h).
  server->keeper_ = std::make_unique<CallbackQueueKeeper>(server->server_.get(), absl::Milliseconds(300));
  return server;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!server_) return;  // it never started
  if (keeper_) keeper_->Stop();
  server_->GetHealthCheckService()->SetServingStatus(false);
  coordinator_->Shutdown();
  store_service_->CloseSessions(
      absl::UnavailableError("the coordinator is shutting down; retry against its replacement"));
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(grace)));
  server_->Wait();
}

}  // namespace dt
