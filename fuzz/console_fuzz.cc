// The web console's JSON API (ConsoleApi, what dtcoord serves under /api/v1/) asked anything by
// an admin or by one run's token, on a live coordinator with two runs (ranks, metrics, logs):
// every answer is JSON; an error is a 4xx with {"error", "code"} naming the cause (never a 500 or
// a crash); and a run token's answers never show the other run's record, files or logs.
//
// Input: a first byte choosing who asks (even: the admin, odd: run A's token), then text: the
// path on the first line ("POST " before it makes it a POST), then "key=value" query parameters,
// one a line. "@A" and "@B" in the path or a value stand for the two runs' ids.
#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/utf8.h"
#include "coordinator/console/console_api.h"
#include "coordinator/metric_pipeline.h"
#include "coordinator/rank_registration.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_coordinator.h"

namespace dt::fuzz {
namespace {

// Run B's experiment name: in its exp dir, its log lines and its record, so in any answer that
// shows run B. (Its id may be echoed back: a caller who names a run knows its id.)
constexpr char kSecretName[] = "zq-beta-not-for-run-a";

struct World : FuzzCoordinator {
  std::string base;
  std::string run_a, run_b;
  std::unique_ptr<ConsoleApi> api;
};

std::string SubmitWithRanks(World& w, const std::string& name) {
  v1::RunSpec spec;
  spec.set_experiment_name(name);
  spec.set_save_dir(JoinPath(w.base, "runs"));
  spec.set_nodes(1);
  spec.set_procs_per_node(2);
  absl::StatusOr<v1::SubmitRunResponse> run = w.coordinator->SubmitRun(spec);
  if (!run.ok()) Fail("cannot submit: " + run.status().ToString());
  for (int slot = 0; slot < 2; ++slot) {
    v1::RegisterRequest req;
    req.set_run_id(run->run_id());
    req.set_node("n1");
    req.set_local_slot(slot);
    req.set_incarnation(absl::StrCat("i", slot));
    req.set_host("host-1");
    req.set_pid(100 + slot);
    w.coordinator->registration().Register(
        req, MakePending<v1::RegisterResponse>([](absl::StatusOr<v1::RegisterResponse>) {}));
  }
  for (int rank = 0; rank < 2; ++rank) {
    v1::MetricBatch batch;
    batch.set_run_id(run->run_id());
    batch.set_rank(rank);
    for (int step = 1; step <= 20; ++step) {
      v1::MetricPoint* p = batch.add_points();
      p->set_step(step);
      (*p->mutable_values())["loss"] = 5.0 / step;
    }
    (void)w.coordinator->metrics().Ingest(batch, [](const absl::Status&) {});
    std::ofstream(JoinPath(run->exp_dir(), absl::StrCat("logs/rank-", rank, ".log")))
        << "2026-01-01T00:00:00.000000Z step 1 loss 5\nsame line on every rank\n"
        << name << " rank " << rank << "\n";
  }
  w.coordinator->AwaitFileWork();
  return run->run_id();
}

World& TheWorld() {
  static World* w = [] {
    SetMinLogLevel(LogLevel::kError);
    auto* world = new World;
    world->base = MakeScratchDir("console");
    absl::Status opened = world->Open(world->base);
    if (!opened.ok()) Fail("the coordinator does not open: " + opened.ToString());
    world->run_a = SubmitWithRanks(*world, "alpha");
    world->run_b = SubmitWithRanks(*world, kSecretName);
    world->api = std::make_unique<ConsoleApi>(world->coordinator.get(),
                                              [](const std::string&) { return std::vector<wandb::WandbRunInfo>{}; });
    return world;
  }();
  return *w;
}

void CheckAnswer(const Principal& who, const ConsoleRequest& req, const std::string& input, const ConsoleResponse& r) {
  std::string what = absl::StrCat(req.method, " ", req.path, " (", who.admin ? "admin" : "run token", ")");
  Check(r.status != 500, what + " answered 500: " + r.body.substr(0, 500));
  Check(r.status == 200 || (r.status >= 400 && r.status < 500), absl::StrCat(what, " answered HTTP ", r.status));
  Check(r.body.size() <= (16u << 20), what + " answered over 16 MiB");
  Check(IsValidUtf8(r.body), what + " answered text that is not UTF-8");
  nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
  Check(!body.is_discarded(), what + " answered something that is not JSON: " + r.body.substr(0, 300));
  if (r.status != 200) {
    Check(body.is_object() && body.contains("error") && body["error"].is_string() &&
              !body["error"].get<std::string>().empty() && body.contains("code") && body["code"].is_string(),
          what + " answered an error without a cause: " + r.body.substr(0, 300));
  }
  if (!who.admin && input.find(kSecretName) == std::string::npos) {
    Check(r.body.find(kSecretName) == std::string::npos, what + " showed another run to a run token");
  }
}

}  // namespace
}  // namespace dt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dt;
  using namespace dt::fuzz;
  if (size < 1 || size > 16 * 1024) return 0;
  World& w = TheWorld();
  Principal who;
  who.admin = data[0] % 2 == 0;
  if (!who.admin) who.run_id = w.run_a;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto bind = [&](std::string s) { return absl::StrReplaceAll(s, {{"@A", w.run_a}, {"@B", w.run_b}}); };
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ConsoleRequest req;
  req.path = bind(lines[0]);
  if (req.path.rfind("POST ", 0) == 0) {
    req.method = "POST";
    req.path = req.path.substr(5);
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> kv = absl::StrSplit(lines[i], absl::MaxSplits('=', 1));
    req.params[kv[0]] = kv.size() > 1 ? bind(kv[1]) : "";
  }
  CheckAnswer(who, req, text, w.api->Handle(who, req));
  return 0;
}
