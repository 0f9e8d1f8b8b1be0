// The key-value store and barriers of a run's current generation.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"

namespace dt {
namespace {

constexpr int64_t kMaxWaitMs = 7 * 24 * 3600 * 1000LL;  // a week: beyond it, surely a mistake

absl::Status ValidateTimeoutMs(int64_t timeout_ms) {
  if (timeout_ms < 0 || timeout_ms > kMaxWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms must be within 0..", kMaxWaitMs, " (0: the run's default), not ", timeout_ms));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<KvStore>> Coordinator::OpenStore(const v1::StoreScope& scope) {
  absl::StatusOr<RunPtr> found = FindRun(scope.run_id());
  if (!found.ok()) return found.status();
  RunPtr run = *found;
  absl::MutexLock lock(&run->mu);
  absl::StatusOr<Generation*> g = LiveGeneration(*run, scope.generation(), scope.rank(), RankUse::kToolAllowed);
  if (!g.ok()) return g.status();
  return (*g)->store;
}

absl::StatusOr<absl::Duration> Coordinator::StoreTimeout(int64_t timeout_ms) const {
  if (absl::Status s = ValidateTimeoutMs(timeout_ms); !s.ok()) return s;
  if (timeout_ms > 0) return absl::Milliseconds(timeout_ms);
  return absl::Milliseconds(policy_.store_timeout_ms());
}

void Coordinator::Barrier(const v1::BarrierRequest& request, PendingPtr<v1::BarrierResponse> reply) {
  if (absl::Status s = ValidateTimeoutMs(request.timeout_ms()); !s.ok()) {
    reply->Complete(s);
    return;
  }
  if (absl::StartsWith(request.name(), "dt.") && request.name() != "dt.data-ready") {
    // dt's own barriers (checkpoint rounds) must not be joined by name from outside.
    reply->Complete(absl::InvalidArgumentError(
        absl::StrCat("barrier name \"", request.name(), "\" is reserved: names starting with \"dt.\" belong to dt")));
    return;
  }
  absl::StatusOr<RunPtr> found = FindRun(request.run_id());
  if (!found.ok()) {
    reply->Complete(found.status());
    return;
  }
  RunPtr run = *found;
  LockedRun locked(*run);
  Deferred& deferred = locked.deferred();
  absl::StatusOr<Generation*> g = LiveGeneration(*run, request.generation(), request.rank());
  if (!g.ok()) {
    reply->Complete(g.status());
    return;
  }
  absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                    : absl::Milliseconds(policy_.barrier_timeout_ms());
  CoordinatorStats* stats = stats_;
  auto released = MakePending<BarrierRelease>([reply, stats](absl::StatusOr<BarrierRelease> r) {
    if (!r.ok()) {
      reply->Complete(r.status());
      return;
    }
    if (stats != nullptr) stats->ObserveBarrierWait(r->waited);
    v1::BarrierResponse out;
    out.set_sequence(r->sequence);
    out.set_waited_ms(absl::ToInt64Milliseconds(r->waited));
    reply->Complete(out);
  });
  (*g)->barriers->Arrive(request.rank(), request.name(), request.sequence(), timeout, released, deferred);
}

}  // namespace dt
