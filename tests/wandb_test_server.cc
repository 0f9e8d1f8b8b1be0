#include "tests/wandb_test_server.h"

#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "tests/test_util.h"

namespace dt::testing {

WandbServer::WandbServer(const std::string& dir) {
  std::string port_file = JoinPath(dir, "wandb.port");
  process_ = std::make_unique<Subprocess>(
      std::vector<std::string>{"/usr/bin/python3", JoinPath(DT_SOURCE_DIR, "tests/wandb_server.py"), "--port-file",
                               port_file, "--api-key", kWandbApiKey},
      std::map<std::string, std::string>{}, JoinPath(dir, "wandb.log"));
  if (!WaitFor([&] { return !Slurp(port_file).empty(); }, absl::Seconds(20))) {
    throw std::runtime_error("the W&B test server did not start: " + Slurp(JoinPath(dir, "wandb.log")));
  }
  url_ = absl::StrCat("http://127.0.0.1:", Slurp(port_file));
}

nlohmann::json WandbServer::State() const {
  auto r = RunCommand({"curl", "-s", url_ + "/_control/state"}, absl::Seconds(10));
  if (!r.ok()) return nlohmann::json();
  return nlohmann::json::parse(r->output, nullptr, false);
}

void WandbServer::Inject(const std::vector<std::string>& faults) const {
  nlohmann::json body = {{"faults", faults}};
  (void)RunCommand({"curl", "-s", "-X", "POST", "-d", body.dump(), url_ + "/_control/faults"}, absl::Seconds(10));
}

std::vector<int64_t> WandbSteps(const nlohmann::json& run) {
  std::vector<int64_t> steps;
  for (const auto& line : run["history"]) steps.push_back(nlohmann::json::parse(line.get<std::string>())["_step"]);
  return steps;
}

std::vector<int64_t> StepRange(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t s = from; s <= to; ++s) v.push_back(s);
  return v;
}

}  // namespace dt::testing
