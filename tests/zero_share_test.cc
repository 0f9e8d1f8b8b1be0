// ZeRO-1's all-gather over a real Gloo group (three ranks as threads of this process, through one
// c10d store): after each rank stepped its range, every rank holds every range, bucket by bucket.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "trainer/process_group.h"
#include "trainer/zero_optimizer.h"

namespace dt {
namespace {

torch::Tensor Flat(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape({-1}));
  return torch::cat(parts);
}

TEST(ZeroShare, EveryRankEndsWithEveryRangeStepped) {
  torch::manual_seed(11);
  // 37 elements: ranges of 13, 13 and 11 at three ranks; buckets of 5 make three all-gathers, the
  // last one partly padding.
  std::vector<torch::Tensor> whole = {torch::randn({4, 6}).requires_grad_(), torch::randn({6}).requires_grad_(),
                                      torch::randn({7}).requires_grad_()};
  std::vector<torch::Tensor> grads;
  for (const auto& p : whole) grads.push_back(torch::randn(p.sizes()));
  constexpr int kWorld = 3;
  const AdamWSettings settings{1e-2, 0.9, 0.95, 0.1};
  std::vector<std::vector<torch::Tensor>> replicas(kWorld);
  for (auto& replica : replicas) {
    for (const auto& p : whole) replica.push_back(p.detach().clone().requires_grad_());
  }
  std::unique_ptr<torch::optim::AdamW> adamw = MakeAdamW(whole, settings);
  for (size_t i = 0; i < whole.size(); ++i) whole[i].mutable_grad() = grads[i].clone();
  adamw->step();

  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<torch::Tensor> results(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto group = CreateProcessGroup("gloo", store, r, kWorld, 0, std::chrono::seconds(60));
        if (!group.ok()) {
          errors[r] = group.status().ToString();
          return;
        }
        ZeroAdamW share(replicas[r], r, kWorld, settings, /*share_bucket_elements=*/5);
        for (size_t i = 0; i < replicas[r].size(); ++i) replicas[r][i].mutable_grad() = grads[i].clone();
        share.Step(settings.lr);
        share.ShareParameters(**group);
        results[r] = Flat(replicas[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::allclose(results[r], Flat(whole), 1e-6, 1e-7)) << "rank " << r;
  }
}

}  // namespace
}  // namespace dt
