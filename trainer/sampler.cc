#include "trainer/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace dt {

DistributedSampler::DistributedSampler(int64_t num_samples, int world_size, int rank, int batch_size, uint64_t seed,
                                       int64_t global_batch)
    : num_samples_(num_samples), world_size_(world_size), rank_(rank), batch_size_(batch_size), seed_(seed) {
  const int64_t micro_batch = static_cast<int64_t>(world_size_) * batch_size_;
  if (global_batch <= 0) global_batch = micro_batch;
  batches_per_epoch_ = (num_samples_ / global_batch) * (global_batch / micro_batch);
}

absl::StatusOr<int> MicroStepsForGlobalBatch(int64_t global_batch, int batch_size, int world_size) {
  const int64_t micro_batch = static_cast<int64_t>(batch_size) * world_size;
  if (global_batch <= 0 || global_batch % micro_batch != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch-size ", global_batch, " is not a multiple of --batch-size ", batch_size, " x ", world_size,
        " rank(s) = ", micro_batch, " (global batch = batch x accumulation x world): choose a global batch that ",
        micro_batch, " divides, or a batch size that divides ", global_batch, " / ", world_size));
  }
  if (global_batch / micro_batch > kMaxMicroSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--global-batch-size ", global_batch, " would take ",
                                                   global_batch / micro_batch, " micro-steps per optimizer step ",
                                                   "at batch ", batch_size, " x ", world_size, " rank(s); the most is ",
                                                   kMaxMicroSteps));
  }
  return static_cast<int>(global_batch / micro_batch);
}

std::string EpochCutChange(int64_t then, int64_t now, int64_t epoch) {
  if (then <= 0 || then == now) return "";
  return absl::StrCat("the checkpoint's epochs were cut at ", then, " samples and this run's at ", now,
                      ": from sample ", std::min(then, now), " of epoch ", epoch,
                      " the data order differs from an uninterrupted run's (the same --global-batch-size on "
                      "both runs cuts every epoch at the same sample)");
}

void DistributedSampler::Shuffle(int64_t epoch) {
  permutation_.resize(num_samples_);
  std::iota(permutation_.begin(), permutation_.end(), 0);
  // Fisher-Yates with mt19937_64 written out, so the order does not depend on the standard
  // library's distributions.
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(permutation_[i], permutation_[j]);
  }
  shuffled_epoch_ = epoch;
}

std::vector<int64_t> DistributedSampler::Batch(int64_t epoch, int64_t batch) {
  if (epoch != shuffled_epoch_) Shuffle(epoch);
  std::vector<int64_t> out(batch_size_);
  for (int i = 0; i < batch_size_; ++i) {
    int64_t j = (batch * batch_size_ + i) * world_size_ + rank_;  // this rank's j-th sample
    out[i] = permutation_[j];
  }
  return out;
}

}  // namespace dt
