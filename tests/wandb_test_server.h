// The strict W&B test server (tests/wandb_server.py, which records every deviation from the wire
// protocol in docs and fails the test on any) as a child process, and readers of its state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/subprocess.h"

namespace dt::testing {

inline constexpr char kWandbApiKey[] = "dt-test-key-0123456789abcdef0123456789abcdef";

class WandbServer {
 public:
  // Starts the server, logging to DIR/wandb.log; throws when it does not come up.
  explicit WandbServer(const std::string& dir);
  const std::string& url() const { return url_; }
  // Its recorded runs, histories and errors (GET /_control/state).
  nlohmann::json State() const;
  // Faults the next requests get, in order ("429", "503", "drop", ...).
  void Inject(const std::vector<std::string>& faults) const;

 private:
  std::unique_ptr<Subprocess> process_;
  std::string url_;
};

// The `_step` of every history row of one W&B run, in the order they arrived.
std::vector<int64_t> WandbSteps(const nlohmann::json& run);
// from, from + 1, ..., to.
std::vector<int64_t> StepRange(int64_t from, int64_t to);

}  // namespace dt::testing
