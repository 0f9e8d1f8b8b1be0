// dtrun's relay to rank 0's TCPStore, over real loopback sockets: a rank that connects before the
// store listens is joined to it once it does, both ways, half-closes included; a connection
// whose relay stops ends instead of hanging.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "client/dtrun/store_relay.h"
#include "common/host.h"
#include "tests/test_util.h"

namespace dt::run {
namespace {

constexpr int kWaitMillis = 10000;  // far above anything here: a hang fails instead of blocking

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int ConnectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "connect to " << port;
  return fd;
}

int ListenOn(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = Loopback(port);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "bind " << port;
  EXPECT_EQ(::listen(fd, 8), 0);
  return fd;
}

bool Readable(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, kWaitMillis) == 1;
}

int Accept(int listener) {
  if (!Readable(listener)) return -1;
  return ::accept(listener, nullptr, nullptr);
}

// Reads until `size` bytes or the end; "<end>" marks an end (or an error) before any byte.
std::string Read(int fd, size_t size) {
  std::string out;
  while (out.size() < size) {
    if (!Readable(fd)) return out + "<timeout>";
    char buf[256];
    ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), size - out.size()), 0);
    if (n <= 0) return out + "<end>";
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void Send(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }

TEST(StoreRelay, ARankThatConnectsBeforeTheStoreListensReachesItOnceItDoesBothWays) {
  absl::StatusOr<int> store_port = FindFreePort();
  ASSERT_TRUE(store_port.ok()) << store_port.status();
  auto relay = StoreRelay::Start("127.0.0.1", *store_port, *store_port);
  ASSERT_TRUE(relay.ok()) << relay.status();
  ASSERT_NE((*relay)->port(), *store_port);

  // The rank connects and sends its first request while nothing listens at the store's port:
  // torch's own client would be refused here and sleep a second.
  int rank = ConnectTo((*relay)->port());
  Send(rank, "validate");

  int listener = ListenOn(*store_port);
  int store = Accept(listener);
  ASSERT_GE(store, 0) << "the relay never connected on to the store";
  EXPECT_EQ(Read(store, 8), "validate");
  Send(store, "ok");
  EXPECT_EQ(Read(rank, 2), "ok");

  // A half-close passes through: the store still answers what it was sent before the end.
  Send(rank, "last");
  ::shutdown(rank, SHUT_WR);
  EXPECT_EQ(Read(store, 5), "last<end>");
  Send(store, "answer");
  ::close(store);
  EXPECT_EQ(Read(rank, 7), "answer<end>");
  ::close(rank);
  ::close(listener);
}

TEST(StoreRelay, EachConnectionGetsItsOwnConnectionToTheStore) {
  absl::StatusOr<int> store_port = FindFreePort();
  ASSERT_TRUE(store_port.ok()) << store_port.status();
  int listener = ListenOn(*store_port);
  auto relay = StoreRelay::Start("127.0.0.1", *store_port, *store_port);
  ASSERT_TRUE(relay.ok()) << relay.status();
  int first = ConnectTo((*relay)->port());
  int second = ConnectTo((*relay)->port());
  Send(first, "1");
  int store_a = Accept(listener);
  Send(second, "2");
  int store_b = Accept(listener);
  ASSERT_GE(store_a, 0);
  ASSERT_GE(store_b, 0);
  // Which accepted connection is whose depends on the relay's threads: answer each with what it got.
  for (int s : {store_a, store_b}) {
    std::string got = Read(s, 1);
    Send(s, "to " + got);
  }
  EXPECT_EQ(Read(first, 4), "to 1");
  EXPECT_EQ(Read(second, 4), "to 2");
  for (int fd : {first, second, store_a, store_b, listener}) ::close(fd);
}

TEST(StoreRelay, ConnectionsOpenedOneAfterAnotherLeaveNoThreadsBehind) {
  absl::StatusOr<int> store_port = FindFreePort();
  ASSERT_TRUE(store_port.ok()) << store_port.status();
  int listener = ListenOn(*store_port);
  auto relay = StoreRelay::Start("127.0.0.1", *store_port, *store_port);
  ASSERT_TRUE(relay.ok()) << relay.status();
  for (int i = 0; i < 40; ++i) {
    int rank = ConnectTo((*relay)->port());
    Send(rank, "x");
    int store = Accept(listener);
    ASSERT_GE(store, 0);
    ASSERT_EQ(Read(store, 1), "x");
    ::close(rank);
    ASSERT_EQ(Read(store, 1), "<end>");
    ::close(store);
  }
  // Each accept joins the connections that have ended by then. A loaded machine may still be
  // ending the last few: one more connection, opened and closed at both ends, is the next accept,
  // until they are in.
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        int rank = ConnectTo((*relay)->port());
        int store = Accept(listener);
        ::close(rank);
        if (store >= 0) ::close(store);
        return (*relay)->connections() <= 2;
      },
      absl::Seconds(10)))
      << (*relay)->connections() << " connections kept";
  ::close(listener);
}

TEST(StoreRelay, StoppingTheRelayEndsItsConnectionsWaitingOrJoined) {
  absl::StatusOr<int> store_port = FindFreePort();
  ASSERT_TRUE(store_port.ok()) << store_port.status();
  auto relay = StoreRelay::Start("127.0.0.1", *store_port, *store_port);
  ASSERT_TRUE(relay.ok()) << relay.status();
  int waiting = ConnectTo((*relay)->port());
  Send(waiting, "a");
  int listener = ListenOn(*store_port);
  int store = Accept(listener);
  ASSERT_GE(store, 0);
  EXPECT_EQ(Read(store, 1), "a");
  ::close(listener);  // the next connection waits for a store that is gone
  int joined = waiting;
  int late = ConnectTo((*relay)->port());
  // The relay has accepted it and is retrying the store, not merely holding it in its backlog.
  ASSERT_TRUE(testing::WaitFor([&] { return (*relay)->connections() == 2; }, absl::Seconds(10)));
  relay->reset();  // dtrun ending with its workers
  EXPECT_EQ(Read(joined, 1), "<end>");
  EXPECT_EQ(Read(late, 1), "<end>");
  EXPECT_EQ(Read(store, 1), "<end>");
  for (int fd : {joined, late, store}) ::close(fd);
}

TEST(StoreRelay, AnAddressNotOnThisMachineIsUnavailable) {
  // 192.0.2.0/24 is TEST-NET-1: no machine has it.
  auto relay = StoreRelay::Start("192.0.2.1", 29500, 29500);
  ASSERT_FALSE(relay.ok());
  EXPECT_EQ(relay.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(relay.status().message().find("192.0.2.1"), std::string::npos) << relay.status();
}

}  // namespace
}  // namespace dt::run
