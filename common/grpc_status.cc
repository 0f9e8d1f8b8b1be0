#include "common/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dt {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status FromCallStatus(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator ended the call (it is shutting down or restarting): ", status.error_message()));
  }
  return FromGrpcStatus(status);
}

}  // namespace dt
