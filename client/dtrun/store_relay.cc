#include "client/dtrun/store_relay.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dt::run {
namespace {

// How often a waiting connection tries rank 0's store again: torch's own client waits 1 s.
constexpr int kRetryMillis = 5;
// How long one connect may take before it is tried again (the target is this machine).
constexpr int kConnectMillis = 1000;
// How long the accept loop rests when the process is out of descriptors or memory.
constexpr int kAcceptBackoffMillis = 100;
constexpr int kAttemptsAtAFreshPort = 4;

using SockAddr = std::vector<unsigned char>;

sockaddr* AsAddr(SockAddr& bytes) { return reinterpret_cast<sockaddr*>(bytes.data()); }
const sockaddr* AsAddr(const SockAddr& bytes) { return reinterpret_cast<const sockaddr*>(bytes.data()); }

int PortOf(SockAddr& addr) {
  sockaddr* a = AsAddr(addr);
  return ntohs(a->sa_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(a)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(a)->sin_port);
}

void SetPort(SockAddr& addr, int port) {
  sockaddr* a = AsAddr(addr);
  if (a->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(a)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in*>(a)->sin_port = htons(static_cast<uint16_t>(port));
  }
}

absl::StatusOr<std::vector<SockAddr>> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(rc)));
  }
  std::vector<SockAddr> addrs;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    auto* first = reinterpret_cast<const unsigned char*>(a->ai_addr);
    addrs.emplace_back(first, first + a->ai_addrlen);
  }
  ::freeaddrinfo(found);
  return addrs;
}

// A listening socket on `addr` at a kernel-picked port other than `avoid_port`, and the port.
absl::StatusOr<std::pair<int, int>> Listen(SockAddr addr, int avoid_port) {
  for (int attempt = 0; attempt < kAttemptsAtAFreshPort; ++attempt) {
    int fd = ::socket(AsAddr(addr)->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
    SetPort(addr, 0);
    socklen_t len = static_cast<socklen_t>(addr.size());
    if (::bind(fd, AsAddr(addr), len) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
        ::getsockname(fd, AsAddr(addr), &len) != 0) {
      int err = errno;
      ::close(fd);
      return absl::UnavailableError(std::strerror(err));
    }
    // The store's own port was only free when it was picked: the kernel may hand it out again.
    if (PortOf(addr) != avoid_port) return std::make_pair(fd, PortOf(addr));
    ::close(fd);
  }
  return absl::UnavailableError(absl::StrCat("the kernel kept offering port ", avoid_port));
}

// A store request is a few bytes and waits for its answer: no Nagle delay on either leg.
void NoDelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A socket retried at a port nothing listens on can connect to itself (TCP simultaneous open).
bool ConnectedToItself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 &&
         ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 && local_len == peer_len &&
         std::memcmp(&local, &peer, local_len) == 0;
}

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Copies `from` to `to` until `from` ends. A clean end is passed on as a half-close, so the other
// side still answers what it was sent; a broken connection breaks both.
void Pump(int from, int to) {
  char buf[64 * 1024];
  while (true) {
    ssize_t n = ::recv(from, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      ::shutdown(to, SHUT_WR);
      return;
    }
    if (n < 0 || !WriteAll(to, buf, static_cast<size_t>(n))) {
      ::shutdown(from, SHUT_RDWR);
      ::shutdown(to, SHUT_RDWR);
      return;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<StoreRelay>> StoreRelay::Start(const std::string& addr, int target_port,
                                                              int avoid_port) {
  absl::StatusOr<std::vector<SockAddr>> resolved = Resolve(addr);
  if (!resolved.ok()) return resolved.status();
  std::string errors;
  for (const SockAddr& candidate : *resolved) {
    absl::StatusOr<std::pair<int, int>> listening = Listen(candidate, avoid_port);
    if (!listening.ok()) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", listening.status().message());
      continue;
    }
    SockAddr target = candidate;
    SetPort(target, target_port);
    return std::unique_ptr<StoreRelay>(new StoreRelay(listening->first, listening->second, std::move(target)));
  }
  return absl::UnavailableError(absl::StrCat("cannot listen on ", addr, ": ", errors));
}

StoreRelay::StoreRelay(int listen_fd, int port, std::vector<unsigned char> target)
    : listen_fd_(listen_fd), port_(port), target_(std::move(target)) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

StoreRelay::~StoreRelay() {
  std::vector<Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  }
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (Connection& c : connections) c.thread.join();
  ::close(listen_fd_);
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

size_t StoreRelay::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_.size();
}

bool StoreRelay::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool StoreRelay::Pause(int millis) {
  pollfd wake = {wake_[0], POLLIN, 0};
  (void)::poll(&wake, wake_[0] >= 0 ? 1 : 0, millis);
  return !Stopping();
}

bool StoreRelay::Track(int fd) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    ::close(fd);
    return false;
  }
  open_.push_back(fd);
  return true;
}

void StoreRelay::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int n = ::poll(fds, wake_[0] >= 0 ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (Stopping()) return;
    int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        DT_LOG(Warning) << "the store relay on port " << port_ << " cannot accept now (" << std::strerror(errno)
                        << "); it tries again";
        if (!Pause(kAcceptBackoffMillis)) return;
        continue;
      }
      // Refused from now on rather than left waiting in the backlog.
      DT_LOG(Warning) << "the store relay on port " << port_ << " stopped accepting: " << std::strerror(errno);
      ::shutdown(listen_fd_, SHUT_RDWR);
      return;
    }
    NoDelay(client);
    if (!Track(client)) return;
    std::vector<Connection> finished;
    {
      absl::MutexLock lock(&mu_);
      auto ended = std::partition(connections_.begin(), connections_.end(),
                                  [](const Connection& c) { return !c.finished->load(); });
      std::move(ended, connections_.end(), std::back_inserter(finished));
      connections_.erase(ended, connections_.end());
      auto done = std::make_shared<std::atomic<bool>>(false);
      connections_.push_back({std::thread([this, client, done] {
                                Serve(client);
                                done->store(true);
                              }),
                              done});
    }
    for (Connection& c : finished) c.thread.join();
  }
}

int StoreRelay::TryConnect() {
  int fd = ::socket(AsAddr(target_)->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int rc = ::connect(fd, AsAddr(target_), static_cast<socklen_t>(target_.size()));
  if (rc != 0 && errno == EINPROGRESS) {
    // Local connects end at once; one whose SYN is dropped is given up, so a stop is never held.
    pollfd fds[2] = {{fd, POLLOUT, 0}, {wake_[0], POLLIN, 0}};
    int err = 0;
    socklen_t len = sizeof(err);
    if (::poll(fds, wake_[0] >= 0 ? 2 : 1, kConnectMillis) > 0 && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP)) &&
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
      rc = 0;
    }
  }
  if (rc != 0 || ConnectedToItself(fd)) {
    ::close(fd);
    return -1;
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // the pumps block
  NoDelay(fd);
  return fd;
}

int StoreRelay::ConnectToTarget() {
  while (true) {
    if (int fd = TryConnect(); fd >= 0) return Track(fd) ? fd : -1;
    // Refused while rank 0's program is still starting: a little later, unless told to stop.
    if (!Pause(kRetryMillis)) return -1;
  }
}

void StoreRelay::Serve(int client) {
  int target = ConnectToTarget();
  absl::Cleanup close_both = [&] {
    absl::MutexLock lock(&mu_);
    for (int fd : {client, target}) {
      if (fd < 0) continue;
      open_.erase(std::remove(open_.begin(), open_.end(), fd), open_.end());
      ::close(fd);
    }
  };
  if (target < 0) return;
  std::thread back([=] { Pump(target, client); });
  Pump(client, target);
  back.join();
}

}  // namespace dt::run
