// absl::Status ⇄ grpc::Status. The code numbering is the same (google.rpc.Code).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dt {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The status of a call this process did not cancel itself. CANCELLED then means the server or
// the connection cut it off — a coordinator draining on SIGTERM (a systemd restart) ends calls
// that way — so it becomes UNAVAILABLE, which every caller already rides out and retries.
absl::Status FromCallStatus(const grpc::Status& status);

}  // namespace dt
