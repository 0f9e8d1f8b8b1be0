#include "common/proto_time.h"

namespace dt {

google::protobuf::Timestamp ToProtoTime(absl::Time t) {
  google::protobuf::Timestamp ts;
  int64_t nanos = absl::ToUnixNanos(t);
  ts.set_seconds(nanos / 1'000'000'000);
  ts.set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
  return ts;
}

absl::Time FromProtoTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace dt
