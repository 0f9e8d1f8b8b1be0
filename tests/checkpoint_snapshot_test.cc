// An asynchronous checkpoint's snapshot (trainer/checkpoint_io.h): its host copy may be made while
// the next step's forward and backward passes run, by any threads at once, and what is written is
// the state of the step boundary, not of the step after it.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "common/fs.h"
#include "tests/test_util.h"
#include "trainer/checkpoint_io.h"
#include "trainer/gpt2_model.h"
#include "trainer/zero_optimizer.h"

namespace dt {
namespace {

TEST(SnapshotCopy, ThreadsSharingTheCopyLeaveEveryByteCopied) {
  // Tensors of several pieces and of less than one, copied by a worker and the completing thread
  // (with its helpers) at once.
  std::vector<torch::Tensor> sources = {torch::randn({3 * static_cast<int64_t>(SnapshotCopy::kPiece) / 4 + 17}),
                                        torch::randn({5}), torch::randn({1000, 700})};
  std::vector<torch::Tensor> copies;
  SnapshotCopy copy;
  for (const torch::Tensor& s : sources) {
    copies.push_back(torch::zeros_like(s));
    copy.Add(static_cast<char*>(copies.back().data_ptr()), static_cast<const char*>(s.data_ptr()),
             s.numel() * s.element_size(), s);
  }
  ASSERT_GT(copy.pieces(), sources.size());
  EXPECT_FALSE(copy.complete());
  std::thread worker([&] { copy.Work(); });
  copy.Complete();
  EXPECT_TRUE(copy.complete());  // Complete returns only once the worker's pieces are done too
  worker.join();
  for (size_t i = 0; i < sources.size(); ++i) EXPECT_TRUE(torch::equal(sources[i], copies[i])) << "tensor " << i;
  copy.Complete();  // again: nothing left, returns at once
}

// The parameters a model.pt holds.
std::vector<torch::Tensor> SavedParameters(const std::string& path, const Gpt2Config& config) {
  Gpt2 loaded(config);
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  loaded->load(archive);
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : loaded->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(CheckpointSnapshot, HoldsTheStepBoundaryWhileTheNextStepRuns) {
  torch::manual_seed(7);
  auto config = MakeGpt2Config("gpt2", "n_embd=32,n_layer=2,n_head=2,n_positions=16,vocab_size=64");
  ASSERT_TRUE(config.ok()) << config.status();
  Gpt2 model(*config);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::Tensor batch = torch::randint(0, config->vocab_size, {2, 16}, torch::kLong);
  auto step = [&] {
    model->Loss(batch, batch).backward();
    optimizer.step();
    optimizer.zero_grad();
  };
  step();  // the optimizer has its moments
  std::vector<torch::Tensor> boundary;
  for (const torch::Tensor& p : model->parameters()) boundary.push_back(p.detach().clone());

  // As CheckpointRounds runs it: the snapshot's archives at the boundary, its copy on a thread
  // while the next step's forward and backward run, the optimizer step once it is complete.
  SnapshotStaging staging;
  staging.Reserve(StagingShapes(model));  // kept buffers, as dttrainer maps them ahead of its first round
  TrainState state;
  state.step = 1;
  auto snapshot = SnapshotArchives(model, optimizer, state, &staging, /*defer_copy=*/true);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_NE(snapshot->pending_copy, nullptr);
  std::thread copier([copy = snapshot->pending_copy] { copy->Work(); });
  model->Loss(batch, batch).backward();
  snapshot->pending_copy->Complete();
  optimizer.step();  // the live state moves on; the snapshot must not
  copier.join();
  for (size_t i = 0; i < boundary.size(); ++i) {
    ASSERT_FALSE(torch::equal(boundary[i], model->parameters()[i])) << "parameter " << i << " did not change";
  }

  testing::TempDir dir;
  auto manifest = WriteArchives(dir.path(), *snapshot);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::vector<torch::Tensor> saved = SavedParameters(JoinPath(dir.path(), "model.pt"), *config);
  ASSERT_EQ(saved.size(), boundary.size());
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_TRUE(torch::equal(saved[i], boundary[i])) << "parameter " << i;
}

// A ZeRO-1 rank's share (its moments, and rank 0's model) is copied off the step too: its archives
// hold the moments of the step boundary once the pending copy is complete, while the live ones
// move on; the staging buffers serve the next round, which holds the moments of its own boundary.
TEST(CheckpointSnapshot, AZeroSharesMomentsAreCopiedOffTheStepAndHoldTheBoundary) {
  torch::manual_seed(7);
  auto config = MakeGpt2Config("gpt2", "n_embd=32,n_layer=2,n_head=2,n_positions=16,vocab_size=64");
  ASSERT_TRUE(config.ok()) << config.status();
  Gpt2 model(*config);
  ZeroAdamW zero(model->parameters(), /*rank=*/1, /*world=*/3, AdamWSettings{1e-2, 0.9, 0.95, 0.1});
  torch::Tensor batch = torch::randint(0, config->vocab_size, {2, 16}, torch::kLong);
  auto step = [&] {
    model->Loss(batch, batch).backward();
    zero.Step(1e-2);
    model->zero_grad();
  };
  SnapshotStaging staging;
  staging.Reserve(ZeroStagingShapes(model, zero, /*with_model=*/true));
  for (int64_t boundary_step = 1; boundary_step <= 2; ++boundary_step) {
    step();
    FlatMoments boundary = zero.Moments();
    TrainState state;
    state.step = boundary_step;
    // Round 2 as a rank without the model: only its moments can leave a copy pending.
    auto share = ZeroShardArchives(model, zero, state, /*with_model=*/boundary_step == 1, &staging);
    ASSERT_TRUE(share.ok()) << share.status();
    ASSERT_NE(share->pending_copy, nullptr) << "round " << boundary_step << " copied on the step";
    std::thread copier([copy = share->pending_copy] { copy->Work(); });
    model->Loss(batch, batch).backward();
    share->pending_copy->Complete();
    zero.Step(1e-2);  // the live moments move on; the share must not
    model->zero_grad();
    copier.join();
    ASSERT_FALSE(torch::equal(zero.Moments().exp_avg, boundary.exp_avg));
    EXPECT_EQ(share->moments.step, boundary.step);
    EXPECT_EQ(share->moments.begin, zero.begin());
    EXPECT_TRUE(torch::equal(share->moments.exp_avg, boundary.exp_avg)) << "round " << boundary_step;
    EXPECT_TRUE(torch::equal(share->moments.exp_avg_sq, boundary.exp_avg_sq)) << "round " << boundary_step;
  }
}

}  // namespace
}  // namespace dt
