#include "client/dtrun/agent_store.h"

namespace dt::run {

absl::StatusOr<std::unique_ptr<AgentStore>> StartAgentStore() {
  return absl::UnimplementedError("dtrun was built without LibTorch");
}

}  // namespace dt::run
