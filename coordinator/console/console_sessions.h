// The web console's sign-ins. Signing in with a token (the admin token or a run token) gives the
// browser an opaque session id in a cookie; the token itself is never stored in the browser. A
// session acts with the permissions of the token it was made from, expires after `ttl`, and dies
// with the process.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"

namespace dt {

class ConsoleSessions {
 public:
  // At most `max_sessions` live at once: signing in beyond that ends the oldest.
  explicit ConsoleSessions(absl::Duration ttl = absl::Hours(12), size_t max_sessions = 4096)
      : ttl_(ttl), max_sessions_(max_sessions) {}

  // A new session id (256 random bits, hex) for `who`.
  std::string Create(const Principal& who, absl::Time now);
  // The principal of a live session; nullopt for an unknown, malformed or expired id.
  std::optional<Principal> Find(const std::string& id, absl::Time now);
  void Remove(const std::string& id);
  size_t size() const;

 private:
  struct Session {
    Principal who;
    absl::Time created;
  };
  // Session ids are kept by their SHA-256: a memory dump does not hand out live sessions.
  const absl::Duration ttl_;
  const size_t max_sessions_;
  mutable absl::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dt
