// Checkpoint rounds: bytes/s of a whole round (the trainer serialises model + AdamW state, writes
// and hashes each file, fsyncs; the coordinator verifies sizes and SHA-256, publishes, moves
// `latest`) for a ~600 MB state, against `dd conv=fsync` of the same size on the same disk. The
// round is also the training stall it causes: every rank waits for the commit.
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

int main() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace dt;
  using namespace dt::bench;
  using Clock = std::chrono::steady_clock;
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
  if (!agent.Register(absl::Minutes(1)).ok()) return 1;

  // ~51M parameters: 200 MB of weights and 400 MB of AdamW moments (quick: ~17M, 200 MB in all).
  auto config = MakeGpt2Config("gpt2", Quick() ? "n_embd=256,n_layer=4,n_head=4,n_positions=128"
                                               : "n_embd=512,n_layer=8,n_head=8,n_positions=128");
  Gpt2 model(*config);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  {
    torch::Tensor x = torch::randint(0, config->vocab_size, {1, 16}, torch::kLong);
    model->Loss(x, x).backward();
    optimizer.step();  // fills the optimizer state
  }
  TrainState state;
  state.model_config = DescribeConfig(*config);
  int repeats = Quick() ? 2 : 4;
  std::vector<double> round_seconds, dd_seconds;
  int64_t bytes = 0;
  int64_t blocks = 1;
  std::string target = JoinPath(save_dir, "dd.bin");
  for (int r = 1; r <= repeats; ++r) {
    auto t0 = Clock::now();
    auto round = agent.BeginCheckpoint(r);
    if (!round.ok()) {
      std::cerr << round.status() << "\n";
      return 1;
    }
    state.step = r;
    auto manifest = WriteCheckpoint(round->partial_dir(), model, optimizer, state);
    if (!manifest.ok()) {
      std::cerr << manifest.status() << "\n";
      return 1;
    }
    auto written = Clock::now();
    auto info = agent.CommitCheckpoint(round->round_id(), &*manifest);
    if (!info.ok()) {
      std::cerr << info.status() << "\n";
      return 1;
    }
    round_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    std::cout << "round " << r << ": write+hash+fsync " << std::chrono::duration<double>(written - t0).count()
              << " s, commit (verify + publish) " << std::chrono::duration<double>(Clock::now() - written).count()
              << " s\n";
    bytes = info->bytes();
    // dd of the same size with conv=fsync, on the same file system, right after (the disk's
    // speed drifts on these machines: interleaving gives both the same conditions).
    blocks = std::max<int64_t>(1, bytes / (4 << 20));
    t0 = Clock::now();
    auto result = RunCommand(
        {"dd", "if=/dev/zero", "of=" + target, "bs=4M", absl::StrCat("count=", blocks), "conv=fsync", "status=none"},
        absl::Minutes(5));
    dd_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!result.ok() || result->exit_code != 0) {
      std::cerr << "dd failed\n";
      return 1;
    }
    ::unlink(target.c_str());
  }
  Summary ours = Summarize(round_seconds), dd = Summarize(dd_seconds);
  double dd_bytes = static_cast<double>(blocks) * (4 << 20);
  std::cout << "checkpoint of " << bytes / 1e6 << " MB: round p50 " << ours.p50 << " s (min " << ours.min
            << "), dd p50 " << dd.p50 << " s\n";
  Report({absl::StrCat("checkpoint round rate (", static_cast<int>(bytes / 1e6), " MB, write+fsync+sha256+commit)"),
          bytes / ours.p50 / 1e6, "MB/s", "dd conv=fsync", dd_bytes / dd.p50 / 1e6, ">= 0.8x", true, 0.8});
  Report({"training stall of one checkpoint round", ours.p50, "s", "dd of the same bytes", dd.p50 * bytes / dd_bytes,
          "", false, 0});
  return 0;
}
