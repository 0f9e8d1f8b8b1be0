// The web console's sign-ins. Signing in with a token (the admin token or a run token) gives the
// browser an opaque session id in a cookie; the token itself is never stored in the browser. A
// session acts with the permissions of the token it was made from, expires after `ttl`, and dies
// with the process.
//
// One token's sign-ins cannot push out another's: each principal (the admin, or one run) keeps at
// most `per_principal` sessions and a new one ends its own oldest; when every slot is taken by
// others, a sign-in is refused rather than evicting them. Sign-ins are throttled: a principal may
// sign in at most `sign_ins_per_minute` times a minute, and after `failures_per_minute` failed
// attempts in a minute every attempt is refused until the minute is over.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"

namespace dt {

struct ConsoleSessionLimits {
  absl::Duration ttl = absl::Hours(12);
  size_t max_sessions = 4096;
  size_t per_principal = 16;
  int sign_ins_per_minute = 20;
  int failures_per_minute = 20;
};

class ConsoleSessions {
 public:
  explicit ConsoleSessions(ConsoleSessionLimits limits = {}) : limits_(limits) {}

  // Whether a sign-in may be tried now (RESOURCE_EXHAUSTED after too many failures this minute).
  absl::Status MayTry(absl::Time now);
  // A failed sign-in (an unknown token), counted against the failures of the minute.
  void Failed(absl::Time now);
  // A new session id (256 random bits, hex) for `who`. RESOURCE_EXHAUSTED when `who` signed in too
  // often this minute, or every session slot is held by other principals.
  absl::StatusOr<std::string> Create(const Principal& who, absl::Time now);
  // The principal of a live session; nullopt for an unknown, malformed or expired id.
  std::optional<Principal> Find(const std::string& id, absl::Time now);
  void Remove(const std::string& id);
  size_t size() const;

 private:
  struct Session {
    Principal who;
    absl::Time created;
  };
  static std::string Key(const Principal& who) { return who.admin ? "" : who.run_id; }
  void Expire(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the entries of `times` older than a minute and returns how many are left.
  static size_t InLastMinute(std::deque<absl::Time>& times, absl::Time now);

  const ConsoleSessionLimits limits_;
  mutable absl::Mutex mu_;
  // Session ids are kept by their SHA-256: a memory dump does not hand out live sessions.
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<absl::Time>> sign_ins_ ABSL_GUARDED_BY(mu_);  // by principal
  std::deque<absl::Time> failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dt
