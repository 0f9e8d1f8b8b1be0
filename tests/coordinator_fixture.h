// The Coordinator driven directly, without a network, on a fake clock and timer queue: the
// fixture the coordinator's unit tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/fs.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_monitor.h"
#include "coordinator/pending.h"
#include "coordinator/rank_registration.h"
#include "coordinator/state_db.h"
#include "coordinator/timer_queue.h"
#include "tests/test_util.h"

namespace dt {
namespace testing {

// Collects an asynchronous reply.
template <typename T>
struct Reply {
  absl::Notification done;
  absl::StatusOr<T> value = absl::UnknownError("no reply");
  PendingPtr<T> pending() {
    return MakePending<T>([this](absl::StatusOr<T> v) {
      value = std::move(v);
      done.Notify();
    });
  }
  bool arrived() const { return done.HasBeenNotified(); }
  bool WaitFor(absl::Duration d = absl::Seconds(10)) { return done.WaitForNotificationWithTimeout(d); }
};

// What checkpoints/latest of `checkpoints_dir` names ("" when nothing), and whether a round's
// partial directory is left there.
inline std::string LatestIn(const std::string& checkpoints_dir) {
  std::error_code ec;
  std::filesystem::path target = std::filesystem::read_symlink(checkpoints_dir + "/latest", ec);
  return ec ? "" : target.string();
}
inline bool AnyPartialIn(const std::string& checkpoints_dir) {
  for (const auto& e : std::filesystem::directory_iterator(checkpoints_dir)) {
    if (e.path().filename().string().find(".partial-") != std::string::npos) return true;
  }
  return false;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    auto db = StateDb::Open(JoinPath(tmp_.path(), "state.db"));
    ASSERT_TRUE(db.ok());
    db_ = std::move(*db);
    CoordinatorOptions options;
    options.timeouts.heartbeat_interval = absl::Seconds(2);
    options.timeouts.heartbeat_timeout = absl::Seconds(30);
    options.timeouts.hang_timeout = absl::Minutes(10);
    options.timeouts.rendezvous_timeout = absl::Minutes(5);
    options.before_file_work = [this](const std::string& exp_dir) { stall_.Pass(exp_dir); };
    options.before_metric_pass = [this] { stall_.Pass(JoinPath(save_dir_, "(metric storage)")); };
    options.metric_bytes_per_run = metric_bytes_per_run_;
    options.max_ranks = max_ranks_;
    coord_ = std::make_unique<Coordinator>(options, &clock_, &timers_, db_.get());
    ASSERT_TRUE(coord_->Load().ok());
  }

  void Reopen() {
    coord_.reset();
    db_.reset();
    Open();
  }

  void Advance(absl::Duration d) {
    // Step in heartbeat-sized slices, checking health as the server's timer would.
    while (d > absl::ZeroDuration()) {
      absl::Duration slice = std::min(d, absl::Seconds(1));
      clock_.Advance(slice);
      timers_.RunDue();
      coord_->health().CheckHealth();
      d -= slice;
    }
  }

  std::string Submit(int nodes, int ppn, int max_restarts = 0, const std::string& name = "exp") {
    auto r = coord_->SubmitRun(testing::MakeSpec(name, save_dir_, nodes, ppn, max_restarts));
    EXPECT_TRUE(r.ok()) << r.status();
    return r->run_id();
  }

  v1::RegisterRequest RegisterRequest(const std::string& run, const std::string& node, int slot,
                                      const std::string& incarnation = "") {
    v1::RegisterRequest req;
    req.set_run_id(run);
    req.set_node(node);
    req.set_local_slot(slot);
    req.set_incarnation(incarnation.empty() ? node + "-" + std::to_string(slot) : incarnation);
    req.set_host("host-" + node);
    req.set_pid(1000 + slot);
    return req;
  }

  // Registers nodes × ppn ranks and returns their assignments by rank. `captures`: the ranks say
  // they capture stacks.
  std::vector<v1::RegisterResponse> RegisterAll(const std::string& run, int nodes, int ppn, bool captures = false) {
    std::vector<std::unique_ptr<Reply<v1::RegisterResponse>>> replies;
    for (int n = nodes - 1; n >= 0; --n) {
      for (int s = 0; s < ppn; ++s) {
        replies.push_back(std::make_unique<Reply<v1::RegisterResponse>>());
        v1::RegisterRequest req = RegisterRequest(run, "n" + std::to_string(n + 1), s);
        req.set_captures_stacks(captures);
        coord_->registration().Register(req, replies.back()->pending());
      }
    }
    std::vector<v1::RegisterResponse> out(nodes * ppn);
    for (auto& r : replies) {
      EXPECT_TRUE(r->arrived());
      EXPECT_TRUE(r->value.ok()) << r->value.status();
      if (r->value.ok()) out[r->value->rank()] = *r->value;
    }
    return out;
  }

  absl::StatusOr<v1::HeartbeatResponse> Beat(const std::string& run, const v1::RegisterResponse& a, int64_t step) {
    v1::HeartbeatRequest req;
    req.set_run_id(run);
    req.set_rank(a.rank());
    req.set_generation(a.generation());
    req.set_incarnation("n" + std::to_string(a.node_rank() + 1) + "-" + std::to_string(a.local_rank()));
    req.set_step(step);
    return coord_->health().Heartbeat(req);
  }

  v1::RunState State(const std::string& run) { return coord_->GetRun(run)->state(); }

  // Generation 0's barrier `name` for `rank` (set the rank before each arrival).
  static v1::BarrierRequest BarrierRequest(const std::string& run, const std::string& name, int64_t timeout_ms) {
    v1::BarrierRequest req;
    req.set_run_id(run);
    req.set_generation(0);
    req.set_name(name);
    req.set_timeout_ms(timeout_ms);
    return req;
  }

  testing::Stall stall_;  // armed with a save dir ("<save dir>/"): its experiment dirs' file work
  int64_t metric_bytes_per_run_ = kDefaultMetricBytesPerRun;
  int64_t max_ranks_ = kDefaultMaxRanks;
  testing::TempDir tmp_;
  std::string save_dir_ = tmp_.Sub("runs");
  FakeClock clock_;
  TimerQueue timers_{&clock_};
  std::unique_ptr<StateDb> db_;
  std::unique_ptr<Coordinator> coord_;
};

}  // namespace testing
}  // namespace dt
