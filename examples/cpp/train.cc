// A LibTorch program with its own model (a linear fit of y = 3x - 2), run under dt by
// `dtctl submit --exec -- train_cpp STEPS [PAUSE_MS [sharded]]` (PAUSE_MS after each step paces a
// demo or a test that acts mid-run; the model takes under 5 ms a step): it acts for the rank dtrun
// registered, builds its Gloo process group on the coordinator's store (no MASTER_ADDR/MASTER_PORT),
// averages gradients with allreduce, reports its loss and progress, and checkpoints in rounds the
// coordinator commits: one writer, or with `sharded` every rank saving its own file (as ranks
// holding parts of a model or optimizer do) in one sharded round.
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "client/agent.h"
#include "client/checkpoint_manifest.h"
#include "client/coordinator_store.h"
#include "client/metrics_reporter.h"

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "train_cpp: " << what << ": " << status << std::endl;
  return 1;
}

// One round: every rank arrives; the writer saves into the round's directory and commits its
// manifest; the others wait for the commit.
absl::Status Checkpoint(dt::Agent& agent, torch::nn::Linear& model, int64_t step) {
  absl::StatusOr<dt::v1::BeginCheckpointResponse> round = agent.BeginCheckpoint(step);
  if (!round.ok()) return round.status();
  if (round->writer_rank() != agent.rank()) return agent.CommitCheckpoint(round->round_id(), nullptr).status();
  torch::save(model, round->partial_dir() + "/model.pt");
  std::ofstream(round->partial_dir() + "/step.txt") << step << "\n";
  absl::StatusOr<dt::v1::Manifest> manifest = dt::ManifestOfDirectory(round->partial_dir());
  if (!manifest.ok()) return manifest.status();
  return agent.CommitCheckpoint(round->round_id(), &*manifest).status();
}

// A sharded round: every rank saves its own file (here its copy of the model; in ZeRO or FSDP its
// part of the state) into the round's shared directory and commits the manifest of that file; the
// coordinator publishes the round once every rank's is in.
absl::Status ShardedCheckpoint(dt::Agent& agent, torch::nn::Linear& model, int64_t step) {
  absl::StatusOr<dt::v1::BeginCheckpointResponse> round = agent.BeginCheckpoint(step, absl::ZeroDuration(), true);
  if (!round.ok()) return round.status();
  std::vector<std::string> mine = {"model-rank" + std::to_string(agent.rank()) + ".pt"};
  torch::save(model, round->partial_dir() + "/" + mine[0]);
  if (agent.rank() == 0) {
    std::ofstream(round->partial_dir() + "/step.txt") << step << "\n";
    mine.push_back("step.txt");
  }
  absl::StatusOr<dt::v1::Manifest> manifest = dt::ManifestOfFiles(round->partial_dir(), mine);
  if (!manifest.ok()) {
    (void)agent.AbortCheckpoint(round->round_id(), std::string(manifest.status().message()));
    return manifest.status();
  }
  std::string layout = "{\"model\": \"replicated\", \"files\": \"model-rank<r>.pt\"}";
  return agent.CommitCheckpoint(round->round_id(), &*manifest, layout).status();
}

}  // namespace

int main(int argc, char** argv) {
  // Gloo writes to its peers with writev: a peer that just died raises SIGPIPE, which kills a C++
  // program unless ignored (Python ignores it). Ignored, Gloo sees EPIPE and the collective fails
  // with an error this rank can report.
  std::signal(SIGPIPE, SIG_IGN);
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 100;
  const int64_t pause_ms = argc > 2 ? std::atoll(argv[2]) : 0;
  const bool sharded = argc > 3 && std::string(argv[3]) == "sharded";
  const int64_t checkpoint_every = 10;
  absl::StatusOr<std::unique_ptr<dt::Agent>> attached = dt::Agent::AttachToDtrun();
  if (!attached.ok()) return Fail("attach", attached.status());
  dt::Agent& agent = **attached;
  agent.StartHeartbeats([](const std::string& reason) {
    std::cerr << "train_cpp: stopping: " << reason << std::endl;
    std::_Exit(3);
  });
  absl::StatusOr<std::unique_ptr<dt::StoreSession>> session = agent.OpenStore();
  if (!session.ok()) return Fail("store", session.status());
  auto coordinator_store = c10::make_intrusive<dt::CoordinatorStore>(std::move(*session), std::chrono::minutes(5));
  // The ranks of this node send their store adds together (null with one rank per node).
  if (std::unique_ptr<dt::StoreCombiner> combiner = agent.OpenStoreCombiner()) {
    coordinator_store->CombineWith(std::move(combiner));
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>("example", coordinator_store);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  // Built in an address exchange: a wait for a peer's address fetches it too (the group's keys are
  // each written once), half the round trips of a wait and a get.
  auto group = [&] {
    dt::CoordinatorStore::AddressExchange exchange(*coordinator_store);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, agent.rank(), agent.world_size(), options);
  }();

  torch::manual_seed(0);
  torch::nn::Linear model(1, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  int64_t start = 0;
  if (const std::string& latest = agent.assignment().resume().path(); !latest.empty()) {
    // A sharded checkpoint: each rank loads the file it wrote.
    bool was_sharded = agent.assignment().resume().sharded();
    torch::load(model, latest + (was_sharded ? "/model-rank" + std::to_string(agent.rank()) + ".pt" : "/model.pt"));
    std::ifstream(latest + "/step.txt") >> start;
    std::cout << "rank " << agent.rank() << ": resumed from step " << start << std::endl;
  }
  dt::MetricsReporter metrics(agent.client(), agent.run_id(), agent.generation(), agent.rank());
  for (int64_t step = start + 1; step <= steps; ++step) {
    torch::manual_seed(step * 1000 + agent.rank());  // each rank its own data, the same on a rerun
    torch::Tensor x = torch::rand({32, 1});
    torch::Tensor loss = torch::mse_loss(model(x), 3 * x - 2);
    optimizer.zero_grad();
    loss.backward();
    for (auto& p : model->parameters()) {
      std::vector<at::Tensor> grad{p.grad()};
      group->allreduce(grad)->wait();
      p.grad().div_(agent.world_size());
    }
    optimizer.step();
    agent.ReportProgress(step, steps);
    metrics.Add(step, {{"loss", loss.item<double>()}});
    if (step % checkpoint_every == 0) {
      absl::Status s = sharded ? ShardedCheckpoint(agent, model, step) : Checkpoint(agent, model, step);
      if (!s.ok()) return Fail("checkpoint", s);
    }
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  (void)metrics.Flush(absl::Seconds(10));
  agent.StopHeartbeats();
  std::cout << "done: " << steps << " steps, weight " << model->weight.item<double>() << ", bias "
            << model->bias.item<double>() << std::endl;
  return 0;
}
