// Asynchronous checkpoint rounds as dttrainer runs them, for a ~600 MB state (~200 MB quick) and
// GPT-2 small's ~1.5 GB (weights and AdamW moments), each against `dd conv=fsync` of the same size
// on the same disk: the training stall (BeginCheckpoint and the copy of the state into host
// memory) and the background rate (serialise the copy, write and hash each file, fsync; the
// coordinator checks the sizes, records the digests, publishes and moves `latest`).
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "client/agent.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "coordinator/embedded.h"
#include "trainer/checkpoint_io.h"
#include "trainer/gpt2_model.h"

namespace dt::bench {
namespace {
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The state of a GPT-2 shape after one AdamW step: weights and both moments.
struct Shape {
  const char* overrides;
  int repeats;
};

// One shape's rounds, each followed by `dd` of its size; reports the shape's two rows.
absl::Status MeasureShape(Agent& agent, const std::string& save_dir, const Shape& shape, int64_t* steps_taken) {
  auto config = MakeGpt2Config("gpt2", shape.overrides);
  if (!config.ok()) return config.status();
  Gpt2 model(*config);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  {
    torch::Tensor x = torch::randint(0, config->vocab_size, {1, 16}, torch::kLong);
    model->Loss(x, x).backward();
    optimizer.step();  // fills the optimizer state
  }
  TrainState state;
  state.model_config = DescribeConfig(*config);
  // Kept across rounds and mapped ahead of the first, as dttrainer does (its thread overlaps
  // the first steps of training; here it is simply done first).
  SnapshotStaging staging;
  {
    std::vector<torch::Tensor> like;
    for (const torch::Tensor& p : model->parameters()) like.insert(like.end(), {p, p, p});
    for (const torch::Tensor& b : model->buffers()) like.push_back(b);
    staging.Reserve(like);
  }
  std::vector<double> pause_seconds, write_seconds, dd_seconds;
  int64_t bytes = 0, blocks = 1;
  std::string target = JoinPath(save_dir, "dd.bin");
  for (int r = 1; r <= shape.repeats; ++r) {
    // An asynchronous round as dttrainer runs it: training pauses for BeginCheckpoint and the
    // copy into host memory; a thread writes, hashes, fsyncs and commits the copy.
    state.step = ++*steps_taken;
    auto t0 = Clock::now();
    auto round = agent.BeginCheckpoint(state.step);
    if (!round.ok()) return round.status();
    auto snapshot = SnapshotArchives(model, optimizer, state, &staging);
    if (!snapshot.ok()) return snapshot.status();
    auto resumed = Clock::now();  // training would go on from here
    auto manifest = WriteArchives(round->partial_dir(), *snapshot);
    if (!manifest.ok()) return manifest.status();
    auto written = Clock::now();
    auto info = agent.CommitCheckpoint(round->round_id(), &*manifest);
    if (!info.ok()) return info.status();
    auto done = Clock::now();
    pause_seconds.push_back(Seconds(t0, resumed));
    write_seconds.push_back(Seconds(resumed, done));
    std::cout << "round " << r << " (" << info->bytes() / 1e6 << " MB): pause (begin + copy) " << pause_seconds.back()
              << " s, write+hash+fsync " << Seconds(resumed, written) << " s, commit " << Seconds(written, done)
              << " s\n";
    bytes = info->bytes();
    // dd of the same size with conv=fsync, on the same file system, right after (the disk's
    // speed drifts on these machines: interleaving gives both the same conditions).
    blocks = std::max<int64_t>(1, bytes / (4 << 20));
    t0 = Clock::now();
    auto result = RunCommand(
        {"dd", "if=/dev/zero", "of=" + target, "bs=4M", absl::StrCat("count=", blocks), "conv=fsync", "status=none"},
        absl::Minutes(5));
    dd_seconds.push_back(Seconds(t0, Clock::now()));
    if (!result.ok()) return result.status();
    if (result->exit_code != 0) return absl::InternalError(absl::StrCat("dd exited with ", result->exit_code));
    ::unlink(target.c_str());
  }
  Summary pause = Summarize(pause_seconds), write = Summarize(write_seconds), dd = Summarize(dd_seconds);
  double dd_bytes = static_cast<double>(blocks) * (4 << 20);
  double dd_same_bytes = dd.p50 * bytes / dd_bytes;
  std::string size = absl::StrCat(static_cast<int>(bytes / 1e6), " MB");
  Report({absl::StrCat("checkpoint write rate (", size, ", background write+sha256+fsync+commit)"),
          bytes / write.p50 / 1e6, "MB/s", "dd conv=fsync", dd_bytes / dd.p50 / 1e6, ">= 0.9x", true, 0.9});
  Report({absl::StrCat("training stall of an async checkpoint round (", size, ", begin + copy to host)"), pause.p50,
          "s", "dd of the same bytes", dd_same_bytes, "<= 0.1x", false, 0.1});
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
      {Quick() ? "n_embd=256,n_layer=4,n_head=4,n_positions=128" : "n_embd=512,n_layer=8,n_head=8,n_positions=128",
       Quick() ? 3 : 4},
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
