// Kernel TCP keepalive on dtcoord's listening sockets, so that every connection it accepts
// notices a dead peer without gRPC's keepalive pings.
//
// Why: gRPC 1.51 re-arms a connection's keepalive timer on every read, which cost 13% of dtcoord's
// CPU at 98,304 heartbeating ranks (coordinator/server.cc). The kernel's keepalive costs nothing
// per message. gRPC offers no public way to set options on the sockets it accepts, but Linux copies
// a listening socket's keepalive options to each connection it accepts, so they are set there
// (found among the process's open descriptors by their local port), and on any connection
// accepted before that.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dt {

struct TcpKeepalive {
  absl::Duration idle = absl::Seconds(30);      // quiet time before the first probe
  absl::Duration interval = absl::Seconds(10);  // between unanswered probes
  int probes = 3;                               // unanswered probes before the connection fails
  // How long written data may stay unacknowledged before the connection fails.
  absl::Duration user_timeout = absl::Seconds(20);
};

struct TcpSocket {
  int fd = -1;
  bool listening = false;
};

// This process's TCP sockets (IPv4 or IPv6) whose local port is `port`: listening ones and the
// connections accepted on it. INTERNAL when /proc/self/fd cannot be read.
absl::StatusOr<std::vector<TcpSocket>> TcpSocketsOnPort(int port);

// Sets `keepalive` on this process's TCP sockets whose local port is `port`: the listening ones
// and the connections they have accepted. Returns how many listening sockets it set: NOT_FOUND
// when there is none (the port is not this process's), INTERNAL when a setsockopt fails.
absl::StatusOr<int> SetKeepaliveOnListeners(int port, const TcpKeepalive& keepalive);

// The keepalive options of socket `fd` as set (tests): idle, interval, probes, user timeout;
// NOT_FOUND when SO_KEEPALIVE is off.
absl::StatusOr<TcpKeepalive> KeepaliveOf(int fd);

}  // namespace dt
