#include "coordinator/console/console_sessions.h"

#include "common/crypto.h"

namespace dt {

std::string ConsoleSessions::Create(const Principal& who, absl::Time now) {
  std::string id = RandomHex(32);
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = now - it->second.created >= ttl_ ? sessions_.erase(it) : std::next(it);
  }
  while (!sessions_.empty() && sessions_.size() >= max_sessions_) {
    auto oldest = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.created < oldest->second.created) oldest = it;
    }
    sessions_.erase(oldest);
  }
  sessions_[Sha256Hex(id)] = Session{who, now};
  return id;
}

std::optional<Principal> ConsoleSessions::Find(const std::string& id, absl::Time now) {
  if (id.size() != 64) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(Sha256Hex(id));
  if (it == sessions_.end()) return std::nullopt;
  if (now - it->second.created >= ttl_) {
    sessions_.erase(it);
    return std::nullopt;
  }
  return it->second.who;
}

void ConsoleSessions::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(Sha256Hex(id));
}

size_t ConsoleSessions::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace dt
