#include "coordinator/tcp_keepalive.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dt {
namespace {

// The local TCP port of socket `fd`; 0 when it is not an IPv4/IPv6 socket.
int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

bool IsTcpSocket(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int type = 0;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

bool IsListening(int fd) {
  int listening = 0;
  socklen_t len = sizeof(listening);
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
}

absl::Status SetInt(int fd, int level, int name, int value, const char* what) {
  if (::setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    return absl::InternalError(absl::StrCat("cannot set ", what, " on socket ", fd, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status Apply(int fd, const TcpKeepalive& k) {
  struct Option {
    int level, name, value;
    const char* what;
  };
  const Option options[] = {
      {SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, static_cast<int>(absl::ToInt64Seconds(k.idle)), "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, static_cast<int>(absl::ToInt64Seconds(k.interval)), "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, k.probes, "TCP_KEEPCNT"},
      {IPPROTO_TCP, TCP_USER_TIMEOUT, static_cast<int>(absl::ToInt64Milliseconds(k.user_timeout)), "TCP_USER_TIMEOUT"},
  };
  for (const Option& o : options) {
    if (absl::Status s = SetInt(fd, o.level, o.name, o.value, o.what); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int> GetInt(int fd, int level, int name) {
  int value = 0;
  socklen_t len = sizeof(value);
  if (::getsockopt(fd, level, name, &value, &len) != 0) {
    return absl::InternalError(absl::StrCat("cannot read socket ", fd, "'s options: ", std::strerror(errno)));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::vector<TcpSocket>> TcpSocketsOnPort(int port) {
  std::vector<TcpSocket> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &fd)) continue;
    if (IsTcpSocket(fd) && LocalPort(fd) == port) out.push_back({fd, IsListening(fd)});
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list /proc/self/fd: ", ec.message()));
  return out;
}

absl::StatusOr<int> SetKeepaliveOnListeners(int port, const TcpKeepalive& keepalive) {
  absl::StatusOr<std::vector<TcpSocket>> sockets = TcpSocketsOnPort(port);
  if (!sockets.ok()) return sockets.status();
  int listeners = 0;
  for (const TcpSocket& socket : *sockets) {
    if (absl::Status s = Apply(socket.fd, keepalive); !s.ok()) return s;
    if (socket.listening) ++listeners;
  }
  if (listeners == 0)
    return absl::NotFoundError(absl::StrCat("no listening TCP socket of this process on port ", port));
  return listeners;
}

absl::StatusOr<TcpKeepalive> KeepaliveOf(int fd) {
  absl::StatusOr<int> on = GetInt(fd, SOL_SOCKET, SO_KEEPALIVE);
  if (!on.ok()) return on.status();
  if (*on == 0) return absl::NotFoundError(absl::StrCat("socket ", fd, " has SO_KEEPALIVE off"));
  TcpKeepalive k;
  absl::StatusOr<int> idle = GetInt(fd, IPPROTO_TCP, TCP_KEEPIDLE);
  absl::StatusOr<int> interval = GetInt(fd, IPPROTO_TCP, TCP_KEEPINTVL);
  absl::StatusOr<int> probes = GetInt(fd, IPPROTO_TCP, TCP_KEEPCNT);
  absl::StatusOr<int> user_timeout = GetInt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT);
  for (const auto* v : {&idle, &interval, &probes, &user_timeout}) {
    if (!v->ok()) return v->status();
  }
  k.idle = absl::Seconds(*idle);
  k.interval = absl::Seconds(*interval);
  k.probes = *probes;
  k.user_timeout = absl::Milliseconds(*user_timeout);
  return k;
}

}  // namespace dt
