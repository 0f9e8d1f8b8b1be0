#include "coordinator/store_ops.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/limits.h"

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
void ApplyBatch(KvStore& store, const Coordinator& coordinator, v1::StoreBatchRequest& batch,
                const std::function<void(v1::StoreResponse)>& done, Deferred& deferred,
                const v1::StoreSessionFeatures& accepted) {
  v1::StoreResponse out;
  if (absl::Status s = CheckBatch(batch.ops(), accepted); !s.ok()) {
    *out.mutable_status() = ToStoreStatus(s);
    done(std::move(out));
    return;
  }
  for (v1::StoreRequest& op : *batch.mutable_ops()) {
    uint64_t id = op.id();
    ApplyStoreOp(
        store, coordinator, op,
        [&out, id](v1::StoreResponse r) {  // called before ApplyStoreOp returns: none of these waits
          r.set_id(id);
          *out.add_batch() = std::move(r);
        },
        deferred);
  }
  done(std::move(out));
}

}  // namespace

void ApplyStoreOp(KvStore& store, const Coordinator& coordinator, v1::StoreRequest& request,
                  std::function<void(v1::StoreResponse)> done, Deferred& deferred,
                  const v1::StoreSessionFeatures& accepted) {
  v1::StoreResponse out;
  absl::Status status;
  auto blocking_timeout = [&](int64_t ms) -> std::optional<absl::Duration> {
    absl::StatusOr<absl::Duration> timeout = coordinator.StoreTimeout(ms);
    if (timeout.ok()) return *timeout;
    status = timeout.status();
    return std::nullopt;
  };
  switch (request.op_case()) {
    case v1::StoreRequest::kSet:
      status = store.Set(request.set().key(), std::move(*request.mutable_set()->mutable_value()), deferred);
      break;
    case v1::StoreRequest::kGet: {
      if (request.get().if_present()) {
        absl::StatusOr<std::optional<std::string>> v = store.GetIfPresent(request.get().key());
        status = v.status();
        if (v.ok() && v->has_value()) {
          out.set_flag(true);
          int64_t limit = request.get().max_value_bytes();
          if (limit > 0 && static_cast<int64_t>((*v)->size()) > limit) {
            out.set_number(static_cast<int64_t>((*v)->size()));  // left out: too long for the sender
          } else {
            out.set_value(std::move(**v));
          }
        }
        break;
      }
      std::optional<absl::Duration> timeout = blocking_timeout(request.get().timeout_ms());
      if (!timeout) break;
      store.Get(request.get().key(), *timeout, MakePending<std::string>([done](absl::StatusOr<std::string> v) {
                  v1::StoreResponse r;
                  if (v.ok()) {
                    r.set_flag(true);
                    r.set_value(std::move(*v));
                  } else {
                    *r.mutable_status() = ToStoreStatus(v.status());
                  }
                  done(std::move(r));
                }),
                deferred);
      return;
    }
    case v1::StoreRequest::kAdd: {
      absl::StatusOr<int64_t> v = store.Add(request.add().key(), request.add().delta(), deferred);
      status = v.status();
      if (v.ok()) out.set_number(*v);
      break;
    }
    case v1::StoreRequest::kCompareSet: {
      const auto& cs = request.compare_set();
      absl::StatusOr<std::string> v = store.CompareSet(cs.key(), cs.expected(), cs.desired(), deferred);
      status = v.status();
      if (v.ok()) out.set_value(std::move(*v));
      break;
    }
    case v1::StoreRequest::kCheck: {
      std::vector<std::string> keys(request.check().keys().begin(), request.check().keys().end());
      absl::StatusOr<bool> v = store.Check(keys);
      status = v.status();
      if (v.ok()) out.set_flag(*v);
      break;
    }
    case v1::StoreRequest::kWait: {
      std::optional<absl::Duration> timeout = blocking_timeout(request.wait().timeout_ms());
      if (!timeout) break;
      std::vector<std::string> keys(request.wait().keys().begin(), request.wait().keys().end());
      store.Wait(keys, *timeout, MakePending<Unit>([done](absl::StatusOr<Unit> v) {
                   v1::StoreResponse r;
                   if (!v.ok()) *r.mutable_status() = ToStoreStatus(v.status());
                   done(std::move(r));
                 }),
                 deferred);
      return;
    }
    case v1::StoreRequest::kDeleteKey: {
      absl::StatusOr<bool> v = store.DeleteKey(request.delete_key().key());
      status = v.status();
      if (v.ok()) out.set_flag(*v);
      break;
    }
    case v1::StoreRequest::kNumKeys: {
      absl::StatusOr<int64_t> v = store.NumKeys();
      status = v.status();
      if (v.ok()) out.set_number(*v);
      break;
    }
    case v1::StoreRequest::kOpen:
      status = absl::InvalidArgumentError("the store session is already open");
      break;
    case v1::StoreRequest::kBatch:
      ApplyBatch(store, coordinator, *request.mutable_batch(), done, deferred, accepted);
      return;
    case v1::StoreRequest::kBarrier:  // handled by the session, which knows its rank
      status = absl::InvalidArgumentError("a barrier goes through a store session (or BarrierService.Barrier)");
      break;
    default:
      status = absl::InvalidArgumentError("store request without an operation");
      break;
  }
  if (!status.ok()) *out.mutable_status() = ToStoreStatus(status);
  done(std::move(out));
}

}  // namespace dt
