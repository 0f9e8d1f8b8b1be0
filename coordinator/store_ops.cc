#include "coordinator/store_ops.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "coordinator/store_barriers.h"

namespace dt {

v1::StoreStatus ToStoreStatus(const absl::Status& s) {
  v1::StoreStatus out;
  out.set_code(static_cast<int>(s.code()));
  out.set_message(std::string(s.message()));
  return out;
}

absl::Status FromStoreStatus(const v1::StoreStatus& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

const v1::StoreSessionFeatures& AllStoreSessionFeatures() {
  static const v1::StoreSessionFeatures* all = [] {
    auto* f = new v1::StoreSessionFeatures();
    f->set_batch_get_if_present(true);
    return f;
  }();
  return *all;
}

namespace {

using Done = std::function<void(v1::StoreResponse)>;

// One operation's call: a handler answers at once (its return value) or, for get and wait, later
// through `done` (it returns nullopt). One short handler per operation, as c10d's TCPStore server.
struct OpCall {
  KvStore& store;
  const Coordinator& coordinator;
  v1::StoreRequest& request;
  const Done& done;
  Deferred& deferred;
  const v1::StoreSessionFeatures& accepted;
};
using Answer = std::optional<v1::StoreResponse>;

v1::StoreResponse Refusal(const absl::Status& s) {
  v1::StoreResponse r;
  *r.mutable_status() = ToStoreStatus(s);
  return r;
}

// The answer of an operation that returns a value: `fill` puts it in the response.
template <typename T, typename Fill>
v1::StoreResponse Result(absl::StatusOr<T> v, Fill fill) {
  if (!v.ok()) return Refusal(v.status());
  v1::StoreResponse r;
  fill(r, std::move(*v));
  return r;
}

Answer SetOp(OpCall& c) {
  v1::StoreSetRequest& set = *c.request.mutable_set();
  absl::Status s = c.store.Set(set.key(), std::move(*set.mutable_value()), c.deferred);
  return s.ok() ? v1::StoreResponse() : Refusal(s);
}

// A get with if_present answers at once: the value, its length when longer than the sender takes
// (max_value_bytes), or nothing.
Answer GetIfPresentOp(OpCall& c) {
  const v1::StoreGetRequest& get = c.request.get();
  return Result(c.store.GetIfPresent(get.key()), [&](v1::StoreResponse& r, std::optional<std::string> v) {
    if (!v) return;
    r.set_flag(true);
    if (get.max_value_bytes() > 0 && static_cast<int64_t>(v->size()) > get.max_value_bytes()) {
      r.set_number(static_cast<int64_t>(v->size()));  // left out: too long for the sender
    } else {
      r.set_value(std::move(*v));
    }
  });
}

Answer GetOp(OpCall& c) {
  if (c.request.get().if_present()) return GetIfPresentOp(c);
  absl::StatusOr<absl::Duration> timeout = c.coordinator.store_barriers().StoreTimeout(c.request.get().timeout_ms());
  if (!timeout.ok()) return Refusal(timeout.status());
  c.store.Get(c.request.get().key(), *timeout, MakePending<std::string>([done = c.done](absl::StatusOr<std::string> v) {
                done(Result(std::move(v), [](v1::StoreResponse& r, std::string value) {
                  r.set_flag(true);
                  r.set_value(std::move(value));
                }));
              }),
              c.deferred);
  return std::nullopt;
}

Answer WaitOp(OpCall& c) {
  absl::StatusOr<absl::Duration> timeout = c.coordinator.store_barriers().StoreTimeout(c.request.wait().timeout_ms());
  if (!timeout.ok()) return Refusal(timeout.status());
  std::vector<std::string> keys(c.request.wait().keys().begin(), c.request.wait().keys().end());
  c.store.Wait(keys, *timeout, MakePending<Unit>([done = c.done](absl::StatusOr<Unit> v) {
                 done(v.ok() ? v1::StoreResponse() : Refusal(v.status()));
               }),
               c.deferred);
  return std::nullopt;
}

Answer AddOp(OpCall& c) {
  return Result(c.store.Add(c.request.add().key(), c.request.add().delta(), c.deferred),
                [](v1::StoreResponse& r, int64_t v) { r.set_number(v); });
}

Answer CompareSetOp(OpCall& c) {
  const v1::StoreCompareSetRequest& cs = c.request.compare_set();
  return Result(c.store.CompareSet(cs.key(), cs.expected(), cs.desired(), c.deferred),
                [](v1::StoreResponse& r, std::string v) { r.set_value(std::move(v)); });
}

Answer CheckOp(OpCall& c) {
  std::vector<std::string> keys(c.request.check().keys().begin(), c.request.check().keys().end());
  return Result(c.store.Check(keys), [](v1::StoreResponse& r, bool v) { r.set_flag(v); });
}

Answer DeleteKeyOp(OpCall& c) {
  return Result(c.store.DeleteKey(c.request.delete_key().key()), [](v1::StoreResponse& r, bool v) { r.set_flag(v); });
}

Answer NumKeysOp(OpCall& c) {
  return Result(c.store.NumKeys(), [](v1::StoreResponse& r, int64_t v) { r.set_number(v); });
}

// A batch holds 1..kMaxStoreBatchOps operations that answer at once (StoreBatchRequest), and a get
// only where `accepted` says so.
absl::Status CheckBatch(const google::protobuf::RepeatedPtrField<v1::StoreRequest>& ops,
                        const v1::StoreSessionFeatures& accepted) {
  if (ops.empty() || ops.size() > kMaxStoreBatchOps) {
    return absl::InvalidArgumentError(
        absl::StrCat("a store batch holds 1 to ", kMaxStoreBatchOps, " operations, not ", ops.size()));
  }
  for (int i = 0; i < ops.size(); ++i) {
    switch (ops[i].op_case()) {
      case v1::StoreRequest::kSet:
      case v1::StoreRequest::kAdd:
      case v1::StoreRequest::kCompareSet:
      case v1::StoreRequest::kCheck:
      case v1::StoreRequest::kDeleteKey:
      case v1::StoreRequest::kNumKeys:
        continue;
      case v1::StoreRequest::kGet:
        if (ops[i].get().if_present()) {
          if (accepted.batch_get_if_present()) continue;
          return absl::InvalidArgumentError(
              absl::StrCat("operation ", i, " of the store batch (id ", ops[i].id(),
                           ") is a get, which this coordinator's batches do not take (its sessions do not offer "
                           "batch_get_if_present): send it on its own"));
        }
        [[fallthrough]];
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("operation ", i, " of the store batch (id ", ops[i].id(),
                         ") is not one that answers at once: a batch holds set, get with if_present, add, "
                         "compare_set, check, delete_key and num_keys only"));
    }
  }
  return absl::OkStatus();
}

// Checked whole before any operation is applied, so a malformed batch changes nothing; then each
// operation in order, its answer (with its id) in the response's `batch` (a set's too: only a
// session's top-level set may go unanswered).
Answer BatchOp(OpCall& c) {
  v1::StoreBatchRequest& batch = *c.request.mutable_batch();
  if (absl::Status s = CheckBatch(batch.ops(), c.accepted); !s.ok()) return Refusal(s);
  v1::StoreResponse out;
  for (v1::StoreRequest& op : *batch.mutable_ops()) {
    uint64_t id = op.id();
    ApplyStoreOp(
        c.store, c.coordinator, op,
        [&out, id](v1::StoreResponse r) {  // called before ApplyStoreOp returns: none of these waits
          r.set_id(id);
          *out.add_batch() = std::move(r);
        },
        c.deferred, c.accepted);
  }
  return out;
}

Answer OpenOp(OpCall&) { return Refusal(absl::InvalidArgumentError("the store session is already open")); }

Answer BarrierOp(OpCall&) {  // the session's, which knows its rank
  return Refusal(absl::InvalidArgumentError("a barrier goes through a store session (or BarrierService.Barrier)"));
}

Answer NoOp(OpCall&) { return Refusal(absl::InvalidArgumentError("store request without an operation")); }

using Handler = Answer (*)(OpCall&);

Handler HandlerFor(v1::StoreRequest::OpCase op) {
  switch (op) {
    case v1::StoreRequest::kSet:
      return SetOp;
    case v1::StoreRequest::kGet:
      return GetOp;
    case v1::StoreRequest::kAdd:
      return AddOp;
    case v1::StoreRequest::kCompareSet:
      return CompareSetOp;
    case v1::StoreRequest::kCheck:
      return CheckOp;
    case v1::StoreRequest::kWait:
      return WaitOp;
    case v1::StoreRequest::kDeleteKey:
      return DeleteKeyOp;
    case v1::StoreRequest::kNumKeys:
      return NumKeysOp;
    case v1::StoreRequest::kBatch:
      return BatchOp;
    case v1::StoreRequest::kOpen:
      return OpenOp;
    case v1::StoreRequest::kBarrier:
      return BarrierOp;
    default:
      return NoOp;
  }
}

}  // namespace

void ApplyStoreOp(KvStore& store, const Coordinator& coordinator, v1::StoreRequest& request,
                  std::function<void(v1::StoreResponse)> done, Deferred& deferred,
                  const v1::StoreSessionFeatures& accepted) {
  OpCall call{store, coordinator, request, done, deferred, accepted};
  if (Answer now = HandlerFor(request.op_case())(call)) done(std::move(*now));
}

}  // namespace dt
