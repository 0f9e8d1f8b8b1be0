// absl::Status ⇄ grpc::Status. The code numbering is the same (google.rpc.Code).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dt {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace dt
