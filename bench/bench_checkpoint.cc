// Asynchronous checkpoint rounds as dttrainer runs them (CheckpointRounds), for a ~600 MB state
// (~200 MB quick) and GPT-2 small's ~1.5 GB (weights and AdamW moments), each against `dd
// conv=fsync` of the same size on the same disk: the training stall (BeginCheckpoint and the
// optimizer step's wait for the copy), the background rate beside a training step (copy the
// state into host memory, serialise the copy, write and hash each file, fsync; the coordinator
// checks the sizes, records the digests, publishes and moves `latest`), and how much longer that
// step takes than the same step without a round.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "client/agent.h"
#include "common/fs.h"
#include "coordinator/embedded.h"
#include "trainer/checkpoint_io.h"
#include "trainer/checkpoint_rounds.h"
#include "trainer/gpt2_model.h"

namespace dt::bench {
namespace {
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Tokens in the training step's batch (one sequence).
constexpr int kSeqLen = 64;

// The state of a GPT-2 shape after one AdamW step: weights and both moments.
struct Shape {
  const char* overrides;
  int repeats;
};

// One training step of `model` (forward, backward, AdamW step) on a fixed batch; `before_step`
// runs between the backward pass and the optimizer step, where dttrainer awaits a round's copy.
template <typename BeforeStep>
void TrainStep(Gpt2& model, torch::optim::AdamW& optimizer, const torch::Tensor& batch, BeforeStep before_step) {
  model->Loss(batch, batch).backward();
  before_step();
  optimizer.step();
  optimizer.zero_grad();
}

// One shape's rounds, each beside a `dd` of its size; reports the shape's three rows.
absl::Status MeasureShape(Agent& agent, const std::string& save_dir, const Shape& shape, int64_t* steps_taken) {
  auto config = MakeGpt2Config("gpt2", shape.overrides);
  if (!config.ok()) return config.status();
  Gpt2 model(*config);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  torch::Tensor batch = torch::randint(0, config->vocab_size, {1, kSeqLen}, torch::kLong);
  TrainStep(model, optimizer, batch, [] {});  // fills the optimizer state
  TrainState state;
  state.model_config = DescribeConfig(*config);
  // Written as dttrainer writes on the CPU (--checkpoint-io auto).
  CheckpointRounds rounds(agent, /*async=*/true, /*exit_before_commit_at=*/0, CheckpointWriteMode(torch::kCPU));
  // Mapped ahead of the first round, as dttrainer does (its thread overlaps the first steps of
  // training; here the first round waits for it).
  rounds.PrepareStaging(StagingShapes(model));
  std::vector<double> stall_seconds, plain_step_seconds, round_step_seconds, write_seconds, dd_seconds;
  int64_t bytes = 0, blocks = 1;
  std::string target = JoinPath(save_dir, "dd.bin");
  for (int r = 1; r <= shape.repeats; ++r) {
    // dd of the round's size (the last round's: they are all one size), on the same file system.
    if (DdGoesFirst(r)) {
      if (absl::Status s = TimeDd(target, blocks, dd_seconds); !s.ok()) return s;
    }
    // A step without a round, then the same step with a round started before it, as dttrainer
    // runs them: the round pauses training for BeginCheckpoint and the snapshot's archives; a
    // thread copies the state while the forward and backward passes run, and the optimizer step
    // waits for what is left of the copy (the stall is those two waits); then the thread writes,
    // hashes, fsyncs and commits while training goes on, which the step's own time shows.
    auto t0 = Clock::now();
    TrainStep(model, optimizer, batch, [] {});
    double plain_step = Seconds(t0, Clock::now());
    state.step = ++*steps_taken;
    t0 = Clock::now();
    absl::StatusOr<absl::Duration> paused = rounds.Start(model, optimizer, state);
    if (!paused.ok()) return paused.status();
    absl::Duration waited;
    TrainStep(model, optimizer, batch, [&] { waited = rounds.AwaitSnapshot(); });
    double round_step = Seconds(t0, Clock::now());
    std::optional<CheckpointRounds::Outcome> outcome = rounds.Wait();
    if (!outcome || !outcome->committed.ok()) {
      return outcome ? outcome->committed.status() : absl::InternalError("the round left no outcome");
    }
    stall_seconds.push_back(absl::ToDoubleSeconds(*paused + waited));
    plain_step_seconds.push_back(plain_step);
    round_step_seconds.push_back(round_step);
    write_seconds.push_back(absl::ToDoubleSeconds(outcome->took - *paused));
    bytes = outcome->committed->bytes();
    std::cout << "round " << r << " (" << bytes / 1e6 << " MB): step " << plain_step << " s alone, " << round_step
              << " s with the round (pause " << absl::ToDoubleSeconds(*paused) << " s, optimizer step waited "
              << absl::ToDoubleSeconds(waited) << " s for the copy); copy+write+hash+fsync+commit "
              << write_seconds.back() << " s\n";
    blocks = std::max<int64_t>(1, bytes / (4 << 20));
    if (!DdGoesFirst(r)) {
      if (absl::Status s = TimeDd(target, blocks, dd_seconds); !s.ok()) return s;
    }
  }
  Summary stall = Summarize(stall_seconds), write = Summarize(write_seconds), dd = Summarize(dd_seconds);
  Summary plain_step = Summarize(plain_step_seconds), round_step = Summarize(round_step_seconds);
  double dd_bytes = static_cast<double>(blocks) * (4 << 20);
  double dd_same_bytes = dd.p50 * bytes / dd_bytes;
  std::string size = absl::StrCat(static_cast<int>(bytes / 1e6), " MB");
  Report({absl::StrCat("checkpoint write rate (", size,
                       ", background copy+write+sha256+fsync+commit beside a training step)"),
          bytes / write.p50 / 1e6, "MB/s", "dd conv=fsync", dd_bytes / dd.p50 / 1e6, ">= 0.9x", true, 0.9});
  Report({absl::StrCat("training stall of an async checkpoint round (", size,
                       ", begin + the optimizer step's wait for the copy)"),
          stall.p50, "s", "dd of the same bytes", dd_same_bytes, "<= 0.1x", false, 0.1});
  Report({absl::StrCat("training step with an async checkpoint round in flight (", size, ", 1 thread)"), round_step.p50,
          "s", "the same step without", plain_step.p50, "", false, 0});
  return absl::OkStatus();
}

}  // namespace
}  // namespace dt::bench

int main() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dt;
  using namespace dt::bench;
  std::cout << "== checkpoint round vs dd conv=fsync (same disk: " << std::filesystem::temp_directory_path() << ")\n";
  torch::set_num_threads(1);
  EmbeddedOptions opts;
  opts.timeouts.heartbeat_timeout = absl::Hours(1);
  opts.timeouts.hang_timeout = absl::Hours(2);
  EmbeddedCoordinator coord(TempDir("ckpt-coord"), opts);
  std::string save_dir = TempDir("ckpt-runs");
  auto admin = coord.AdminClient();
  v1::SubmitRunRequest req;
  req.mutable_spec()->set_experiment_name("ckpt-bench");
  req.mutable_spec()->set_save_dir(save_dir);
  req.mutable_spec()->set_nodes(1);
  req.mutable_spec()->set_procs_per_node(1);
  req.mutable_spec()->set_keep_checkpoints(1);
  auto run = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  if (!run.ok()) {
    std::cerr << run.status() << "\n";
    return 1;
  }
  AgentOptions id;
  id.run_id = run->run_id();
  id.node = "bench";
  id.host = "bench";
  Agent agent(coord.Client(run->run_token()), id);
  if (auto registered = agent.Register(absl::Minutes(1)); !registered.ok()) {
    std::cerr << registered.status() << "\n";
    return 1;
  }
  std::vector<Shape> shapes = {
      // ~17M parameters (~200 MB) quick, ~51M (~600 MB) otherwise; and GPT-2 small (124M, ~1.5 GB).
      {Quick() ? "n_embd=256,n_layer=4,n_head=4,n_positions=128" : "n_embd=512,n_layer=8,n_head=8,n_positions=128", 4},
      {"n_embd=768,n_layer=12,n_head=12,n_positions=1024", Quick() ? 2 : 3}};
  int64_t steps_taken = 0;
  for (const Shape& shape : shapes) {
    if (absl::Status s = MeasureShape(agent, save_dir, shape, &steps_taken); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
  }
  return 0;
}
