// ZeRO-1's partition of AdamW, without processes: each rank's share steps its elements exactly as
// the unpartitioned AdamW does, and moments written at one world size regather at another.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "common/fs.h"
#include "tests/test_util.h"
#include "trainer/zero_optimizer.h"

namespace dt {
namespace {

// A matrix (decayed), a bias (not decayed) and another matrix: 22 elements.
std::vector<torch::Tensor> Params() {
  torch::manual_seed(7);
  return {torch::randn({3, 4}).requires_grad_(), torch::randn({4}).requires_grad_(),
          torch::randn({2, 3}).requires_grad_()};
}

std::vector<torch::Tensor> Copy(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

torch::Tensor Flat(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape({-1}));
  return torch::cat(parts);
}

void SetFlat(std::vector<torch::Tensor>& params, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params) {
    p.detach().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

void SetGrads(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
}

const AdamWSettings kSettings{1e-2, 0.9, 0.95, 0.1};

TEST(ZeroRange, TheRangesCoverEveryElementOnceTheLastShorter) {
  EXPECT_EQ(ZeroRange(10, 0, 4), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(ZeroRange(10, 3, 4), std::make_pair(int64_t{9}, int64_t{10}));
  EXPECT_EQ(ZeroRange(2, 1, 4), std::make_pair(int64_t{1}, int64_t{2}));
  EXPECT_EQ(ZeroRange(2, 3, 4), std::make_pair(int64_t{2}, int64_t{2}));  // fewer elements than ranks: empty
  EXPECT_TRUE(IsZeroMomentsFileName(ZeroMomentsFileName(3, 4)));
  EXPECT_FALSE(IsZeroMomentsFileName("optimizer.pt"));
}

// Three ranks' shares, each stepping its range on its own replica, give the parameters and the
// moments of one AdamW over all of them; the moments, written as files, load at two ranks.
TEST(ZeroAdamW, SharesStepAsOneAdamWAndRegatherAtAnotherWorldSize) {
  std::vector<torch::Tensor> whole = Params();
  std::unique_ptr<torch::optim::AdamW> adamw = MakeAdamW(whole, kSettings);
  constexpr int kWorld = 3;
  std::vector<std::vector<torch::Tensor>> replicas;
  std::vector<std::unique_ptr<ZeroAdamW>> shares;
  for (int r = 0; r < kWorld; ++r) {
    replicas.push_back(Copy(whole));
    shares.push_back(std::make_unique<ZeroAdamW>(replicas.back(), r, kWorld, kSettings));
  }
  for (int step = 1; step <= 3; ++step) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : whole) grads.push_back(torch::randn(p.sizes()));
    SetGrads(whole, grads);
    for (auto& g : adamw->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(kSettings.lr);
    adamw->step();
    torch::Tensor combined = torch::zeros({22});
    for (int r = 0; r < kWorld; ++r) {
      SetGrads(replicas[r], grads);
      shares[r]->Step(kSettings.lr);
      int64_t b = shares[r]->begin(), e = shares[r]->end();
      combined.narrow(0, b, e - b).copy_(Flat(replicas[r]).narrow(0, b, e - b));
    }
    ASSERT_TRUE(torch::allclose(combined, Flat(whole), 1e-6, 1e-7)) << "step " << step;
    for (auto& replica : replicas) SetFlat(replica, combined);  // what ShareParameters does
  }
  FlatMoments all = MomentsOfAdamW(*adamw, whole);
  EXPECT_EQ(all.step, 3);
  testing::TempDir tmp;
  std::vector<FlatMoments> files;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(shares[r]->step(), 3);
    std::string path = JoinPath(tmp.path(), ZeroMomentsFileName(r, kWorld));
    MomentsArchive(shares[r]->Moments()).save_to(path);
    absl::StatusOr<FlatMoments> read = ReadMomentsFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    files.push_back(*read);
  }
  absl::StatusOr<FlatMoments> regathered = Regather(files, 0, 22);
  ASSERT_TRUE(regathered.ok()) << regathered.status();
  EXPECT_TRUE(torch::allclose(regathered->exp_avg, all.exp_avg, 1e-6, 1e-9));
  EXPECT_TRUE(torch::allclose(regathered->exp_avg_sq, all.exp_avg_sq, 1e-6, 1e-12));

  // At two ranks, each loads its new range; one more step still matches the whole AdamW.
  std::vector<torch::Tensor> grads;
  for (const auto& p : whole) grads.push_back(torch::randn(p.sizes()));
  SetGrads(whole, grads);
  adamw->step();
  torch::Tensor combined = torch::zeros({22});
  for (int r = 0; r < 2; ++r) {
    std::vector<torch::Tensor> replica = Copy(replicas[0]);
    ZeroAdamW share(replica, r, 2, kSettings);
    absl::StatusOr<FlatMoments> mine = Regather(files, share.begin(), share.end());
    ASSERT_TRUE(mine.ok()) << mine.status();
    ASSERT_TRUE(share.LoadMoments(*mine).ok());
    SetGrads(replica, grads);
    share.Step(kSettings.lr);
    combined.narrow(0, share.begin(), share.end() - share.begin())
        .copy_(Flat(replica).narrow(0, share.begin(), share.end() - share.begin()));
  }
  EXPECT_TRUE(torch::allclose(combined, Flat(whole), 1e-6, 1e-7));

  // And into one unpartitioned AdamW (a --zero 1 checkpoint resumed with --zero 0).
  std::vector<torch::Tensor> fresh = Copy(replicas[0]);
  std::unique_ptr<torch::optim::AdamW> reloaded = MakeAdamW(fresh, kSettings);
  ASSERT_TRUE(SetAdamWMoments(*reloaded, fresh, *regathered).ok());
  SetGrads(fresh, grads);
  reloaded->step();
  EXPECT_TRUE(torch::allclose(Flat(fresh), Flat(whole), 1e-6, 1e-7));
}

TEST(ZeroAdamW, AMissingShareIsNamedAndNothingIsLoaded) {
  std::vector<FlatMoments> parts(2);
  for (int r = 0; r < 2; ++r) {
    auto [b, e] = ZeroRange(10, r, 3);
    parts[r].begin = b;
    parts[r].end = e;
    parts[r].numel = 10;
    parts[r].step = 4;
    parts[r].exp_avg = torch::ones({e - b});
    parts[r].exp_avg_sq = torch::ones({e - b});
  }
  absl::StatusOr<FlatMoments> all = Regather(parts, 0, 10);
  EXPECT_EQ(all.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(all.status().message().find("cover 8 of elements [0, 10): a file is missing"), std::string::npos)
      << all.status();
  // An empty range (a rank with nothing to keep) needs only the step.
  absl::StatusOr<FlatMoments> none = Regather(parts, 10, 10);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->step, 4);
  EXPECT_EQ(none->exp_avg.numel(), 0);
  parts[1].step = 5;
  EXPECT_NE(Regather(parts, 0, 8).status().message().find("written at AdamW steps 4 and 5"), std::string::npos);
  std::vector<torch::Tensor> params = Params();
  ZeroAdamW share(params, 0, 2, kSettings);
  EXPECT_EQ(share.LoadMoments(parts[0]).code(), absl::StatusCode::kFailedPrecondition);  // not its range
}

// On a GPU, StepAdamW is ATen's fused AdamW kernel (LibTorch >= 2.1): over four steps it moves the
// parameters and moments as LibTorch's own AdamW does on the CPU, up to float rounding, and counts
// the same steps (which checkpoints hold). Skipped without a CUDA device.
TEST(StepAdamW, OnAGpuStepsAsLibTorchsAdamWOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<torch::Tensor> on_cpu = Params();
  std::vector<torch::Tensor> on_gpu;
  for (const auto& p : on_cpu) on_gpu.push_back(p.detach().to(torch::kCUDA).requires_grad_());
  std::unique_ptr<torch::optim::AdamW> reference = MakeAdamW(on_cpu, kSettings);
  std::unique_ptr<torch::optim::AdamW> fused = MakeAdamW(on_gpu, kSettings);
  for (int step = 1; step <= 4; ++step) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : on_cpu) grads.push_back(torch::randn(p.sizes()));
    SetGrads(on_cpu, grads);
    for (size_t i = 0; i < grads.size(); ++i) on_gpu[i].mutable_grad() = grads[i].to(torch::kCUDA);
    reference->step();
    StepAdamW(*fused);
    std::vector<torch::Tensor> back;
    for (const auto& p : on_gpu) back.push_back(p.detach().cpu());
    ASSERT_TRUE(torch::allclose(Flat(back), Flat(on_cpu), 1e-6, 1e-7)) << "step " << step;
  }
  FlatMoments want = MomentsOfAdamW(*reference, on_cpu);
  FlatMoments got = MomentsOfAdamW(*fused, on_gpu);
  EXPECT_EQ(got.step, 4);
  // The fused kernel forms the first moment as a lerp, LibTorch as a product and a sum: the two
  // round apart by a few float steps of the largest moment (a wrong beta or bias correction would
  // be thousands of them).
  for (const auto& [name, a, b] :
       {std::tuple{"exp_avg", got.exp_avg, want.exp_avg}, std::tuple{"exp_avg_sq", got.exp_avg_sq, want.exp_avg_sq}}) {
    const double scale = b.abs().max().item<double>();
    const double worst = (a.cpu() - b).abs().max().item<double>();
    EXPECT_LE(worst, 1e-5 * scale) << name << ": largest difference " << worst << " of moments up to " << scale;
  }
}

}  // namespace
}  // namespace dt
