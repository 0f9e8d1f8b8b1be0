// The store's operations as requests: one interpreter of a StoreRequest for the pipelined
// session and the unary RPCs alike (and for the request fuzzer), free of gRPC.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "coordinator/coordinator.h"
#include "coordinator/kv_store.h"
#include "dt/v1/store.pb.h"

namespace dt {

v1::StoreStatus ToStoreStatus(const absl::Status& s);
absl::Status FromStoreStatus(const v1::StoreStatus& s);

// Everything this build's store sessions accept beyond the stream's first version.
const v1::StoreSessionFeatures& AllStoreSessionFeatures();

// Applies the operation of `request` to `store` and gives `done` the answer (without the id) — at
// once, or for get and wait once the keys appear or the timeout passes (on whichever thread that
// happens). A batch (StoreBatchRequest) is answered at once, with each operation's answer in the
// response's `batch`; one holding what `accepted` leaves out (a get, without
// batch_get_if_present) is refused whole, as a coordinator before that feature refused it. Open
// and barrier are the session's: INVALID_ARGUMENT here.
void ApplyStoreOp(KvStore& store, const Coordinator& coordinator, v1::StoreRequest& request,
                  std::function<void(v1::StoreResponse)> done, Deferred& deferred,
                  const v1::StoreSessionFeatures& accepted = AllStoreSessionFeatures());

}  // namespace dt
