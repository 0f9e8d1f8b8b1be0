#include <exception>

#include "absl/strings/str_cat.h"
#include "client/dtrun/agent_store.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

namespace dt::run {
namespace {

class TorchAgentStore : public AgentStore {
 public:
  explicit TorchAgentStore(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AgentStore>> StartAgentStore() {
  c10d::TCPStoreOptions o;
  o.port = 0;  // the kernel picks a free one: no window between finding a port and binding it
  o.isServer = true;
  o.waitWorkers = false;  // the workers count themselves in; the agent does not wait for them
  try {
    return std::make_unique<TorchAgentStore>(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("could not start the workers' TCPStore: ", e.what()));
  }
}

}  // namespace dt::run
