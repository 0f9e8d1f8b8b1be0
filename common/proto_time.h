// absl::Time <-> google.protobuf.Timestamp (protobuf's own util/time_util pulls in more than needed
// and speaks a third time type).
#pragma once

#include <google/protobuf/timestamp.pb.h>

#include "absl/time/time.h"

namespace dt {

google::protobuf::Timestamp ToProtoTime(absl::Time t);
absl::Time FromProtoTime(const google::protobuf::Timestamp& t);

}  // namespace dt
