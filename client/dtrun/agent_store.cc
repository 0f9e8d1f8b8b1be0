#include "client/dtrun/agent_store.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/host.h"

namespace dt::run {

std::optional<int> AgentStore::Ended() {
  int status = helper_->Wait(absl::ZeroDuration());
  if (status == -1) return std::nullopt;
  return status;
}

absl::StatusOr<std::unique_ptr<AgentStore>> StartAgentStore() {
  std::string helper = JoinPath(ExecutableDir(), "dtrun-store");
  if (::access(helper.c_str(), X_OK) != 0) {
    return absl::UnimplementedError(absl::StrCat(helper, " is missing (a build without LibTorch)"));
  }
  absl::StatusOr<int> port = FindFreePort();
  if (!port.ok()) return port.status();
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn({helper, absl::StrCat(*port)});
  if (!p.ok()) return p.status();
  return std::make_unique<AgentStore>(std::move(*p), *port);
}

}  // namespace dt::run
