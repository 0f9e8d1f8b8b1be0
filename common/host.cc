#include "common/host.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dt {

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string NodeName() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm != nullptr && *slurm != '\0') return slurm;
  return HostName();
}

absl::StatusOr<std::string> LocalAddressTowards(const std::string& host_port) {
  std::string host = host_port;
  size_t colon = host_port.rfind(':');
  if (colon != std::string::npos && host_port.find(']') == std::string::npos && host_port.find(':') != colon) {
    colon = std::string::npos;  // a bare IPv6 address
  }
  std::string port = colon == std::string::npos ? "1" : host_port.substr(colon + 1);
  if (colon != std::string::npos) host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address of ", host, " is reachable"));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    // connect() on a datagram socket only picks the route and the source address.
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
              ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    int err = errno;
    ::close(fd);
    if (!ok) {
      last = absl::UnavailableError(absl::StrCat("no route to ", host, ": ", std::strerror(err)));
      continue;
    }
    char text[INET6_ADDRSTRLEN] = {0};
    const void* addr = local.ss_family == AF_INET6
                           ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) == nullptr) continue;
    ::freeaddrinfo(found);
    return std::string(text);
  }
  ::freeaddrinfo(found);
  return last;
}

absl::StatusOr<int> FindFreePort() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_storage addr{};
  socklen_t len;
  if (v6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_any;
    len = sizeof(*a6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof(*a4);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("no free TCP port: ", std::strerror(err)));
  }
  ::close(fd);
  return ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                  : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace dt
