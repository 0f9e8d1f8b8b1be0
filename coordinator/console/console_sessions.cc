#include "coordinator/console/console_sessions.h"

#include "absl/strings/str_cat.h"
#include "common/crypto.h"

namespace dt {

size_t ConsoleSessions::InLastMinute(std::deque<absl::Time>& times, absl::Time now) {
  while (!times.empty() && now - times.front() >= absl::Minutes(1)) times.pop_front();
  return times.size();
}

void ConsoleSessions::Expire(absl::Time now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = now - it->second.created >= limits_.ttl ? sessions_.erase(it) : std::next(it);
  }
}

absl::Status ConsoleSessions::MayTry(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (InLastMinute(failures_, now) >= static_cast<size_t>(limits_.failures_per_minute)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        limits_.failures_per_minute, " sign-ins with unknown tokens in the last minute: sign-in is paused until ",
        absl::FormatDuration(absl::Trunc(absl::Minutes(1) - (now - failures_.front()), absl::Seconds(1))),
        " from now"));
  }
  return absl::OkStatus();
}

void ConsoleSessions::Failed(absl::Time now) {
  absl::MutexLock lock(&mu_);
  failures_.push_back(now);
}

absl::StatusOr<std::string> ConsoleSessions::Create(const Principal& who, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Expire(now);
  std::string key = Key(who);
  std::deque<absl::Time>& recent = sign_ins_[key];
  if (InLastMinute(recent, now) >= static_cast<size_t>(limits_.sign_ins_per_minute)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this token signed in ", limits_.sign_ins_per_minute, " times in the last minute: wait a minute"));
  }
  // This principal's own oldest session makes room for its new one.
  std::vector<std::map<std::string, Session>::iterator> own;
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (Key(it->second.who) == key) own.push_back(it);
  }
  while (!own.empty() && own.size() >= limits_.per_principal) {
    auto oldest = own.begin();
    for (auto it = own.begin(); it != own.end(); ++it) {
      if ((*it)->second.created < (*oldest)->second.created) oldest = it;
    }
    sessions_.erase(*oldest);
    own.erase(oldest);
  }
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat("the console holds ", limits_.max_sessions,
                                                     " sessions of other tokens: sign out elsewhere, or wait for "
                                                     "sessions to expire"));
  }
  recent.push_back(now);
  std::string id = RandomHex(32);
  sessions_[Sha256Hex(id)] = Session{who, now};
  return id;
}

std::optional<Principal> ConsoleSessions::Find(const std::string& id, absl::Time now) {
  if (id.size() != 64) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(Sha256Hex(id));
  if (it == sessions_.end()) return std::nullopt;
  if (now - it->second.created >= limits_.ttl) {
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
