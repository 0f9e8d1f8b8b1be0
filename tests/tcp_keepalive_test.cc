// dtcoord's connections carry the kernel's TCP keepalive (coordinator/tcp_keepalive.h): it stands
// in for gRPC's keepalive pings, which dtcoord no longer sends, so that a crashed peer's
// connection still fails within about a minute.
#include "coordinator/tcp_keepalive.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "coordinator/embedded.h"
#include "tests/test_util.h"

namespace dt {
namespace {

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

void ExpectDefaults(int fd, const char* what) {
  absl::StatusOr<TcpKeepalive> k = KeepaliveOf(fd);
  ASSERT_TRUE(k.ok()) << what << ": " << k.status();
  const TcpKeepalive want;
  EXPECT_EQ(k->idle, want.idle) << what;
  EXPECT_EQ(k->interval, want.interval) << what;
  EXPECT_EQ(k->probes, want.probes) << what;
  EXPECT_EQ(k->user_timeout, want.user_timeout) << what;
}

// The listening socket and a connection accepted after start (a real gRPC call on it) carry it,
// and gRPC did not take it off the accepted one.
TEST(TcpKeepaliveTest, TheCoordinatorsListenerAndTheConnectionsItAcceptsCarryKeepalive) {
  testing::TempDir dir;
  EmbeddedCoordinator coordinator(dir.Sub("state"));
  auto admin = coordinator.Client(coordinator.admin_token(), /*private_connection=*/true);
  std::unique_ptr<grpc::ClientContext> context = admin->Context(absl::Seconds(10));
  v1::ListRunsResponse runs;
  grpc::Status listed = admin->runs().ListRuns(context.get(), v1::ListRunsRequest(), &runs);
  ASSERT_TRUE(listed.ok()) << listed.error_message();
  int listeners = 0, accepted = 0;
  absl::StatusOr<std::vector<TcpSocket>> sockets = TcpSocketsOnPort(PortOf(coordinator.address()));
  ASSERT_TRUE(sockets.ok()) << sockets.status();
  for (const TcpSocket& socket : *sockets) {
    ExpectDefaults(socket.fd, socket.listening ? "the listening socket" : "an accepted connection");
    ++(socket.listening ? listeners : accepted);
  }
  EXPECT_EQ(listeners, 1);
  EXPECT_GE(accepted, 1) << "the call's connection was not found among this process's sockets";
}

// Connections accepted before the options were set get them too; a port no socket of this
// process listens on is NOT_FOUND.
TEST(TcpKeepaliveTest, ConnectionsAcceptedBeforehandAreSetAndAnUnknownPortIsNotFound) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  int early = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(early, 0);
  EXPECT_EQ(KeepaliveOf(early).status().code(), absl::StatusCode::kNotFound) << "keepalive is on before it was set";

  absl::StatusOr<int> set = SetKeepaliveOnListeners(port, TcpKeepalive{});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(*set, 1);
  ExpectDefaults(early, "the connection accepted before");
  int client2 = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client2, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  int late = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(late, 0);
  ExpectDefaults(late, "a connection accepted after (inherited from the listener)");
  EXPECT_EQ(KeepaliveOf(client).status().code(), absl::StatusCode::kNotFound) << "the client's end is not ours to set";

  for (int fd : {client, client2, early, late, listener}) ::close(fd);
  absl::StatusOr<int> gone = SetKeepaliveOnListeners(port, TcpKeepalive{});
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find(std::to_string(port)), std::string::npos) << gone.status();
}

}  // namespace
}  // namespace dt
