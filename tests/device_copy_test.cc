// The device-to-host copies of checkpoints and step figures (trainer/device_copy.h), on a GPU:
// skipped without one (scripts/gpu-check.sh runs them on a GPU machine and fails on a skip).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainer/device_copy.h"

namespace dt {
namespace {

torch::Tensor PinnedLike(const torch::Tensor& t) {
  return torch::empty(t.sizes(), torch::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
}

// A step's few figures read on the training stream come to the host before a checkpoint round's
// copies queued after them on a side stream: the side stream starts after the training stream's
// work so far, that read included, whichever stream the copy engine would serve first. (On a side
// stream of its own the read sometimes ran after all of a round's 1.5 GB on an H200.) The training
// stream is kept busy first, so that both wait for it and are ready at once.
TEST(DeviceCopies, AReadOnTheTrainingStreamEndsBeforeARoundQueuedAfterIt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::Tensor state = torch::ones({64 << 20}, torch::kCUDA);  // 256 MB, as a round copies it
  for (int i = 0; i < 1000; ++i) state.mul_(1.0);               // over 100 ms of the stream's work on an H200
  torch::Tensor figures = state.narrow(0, 0, 2) * 3;
  torch::Tensor figures_on_host = PinnedLike(figures), state_on_host = PinnedLike(state);

  DeviceToHostCopies read(figures.device(), CopyStream::kCurrent);
  read.Add(figures_on_host, figures);
  read.Seal();
  DeviceToHostCopies round(state.device(), CopyStream::kSide);
  round.Add(state_on_host, state);
  round.Seal();
  EXPECT_FALSE(round.Done()) << "the training stream's work was over before the round was queued";
  round.Wait();
  EXPECT_TRUE(read.Done()) << "the round's copies ended before the read queued ahead of them";
  read.Wait();
  EXPECT_EQ(figures_on_host[0].item<float>(), 3.0f);
  EXPECT_EQ(state_on_host.sum().item<double>(), static_cast<double>(64 << 20));
}

// LateRead brings a tensor's values to the host as doubles in their flat order, on either stream.
TEST(DeviceCopies, ALateReadGivesTheValuesOnEitherStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::Tensor values = torch::tensor({1.5f, -2.0f, 4.25f}, torch::kCUDA).reshape({3, 1});
  for (CopyStream stream : {CopyStream::kCurrent, CopyStream::kSide}) {
    LateRead read(values, stream);
    EXPECT_EQ(read.Values(), (std::vector<double>{1.5, -2.0, 4.25}));
  }
}

}  // namespace
}  // namespace dt
