#include "trainer/sampler.h"

#include <numeric>
#include <random>

namespace dt {

DistributedSampler::DistributedSampler(int64_t num_samples, int world_size, int rank, int batch_size, uint64_t seed)
    : num_samples_(num_samples), world_size_(world_size), rank_(rank), batch_size_(batch_size), seed_(seed) {
  batches_per_epoch_ = (num_samples_ / world_size_) / batch_size_;
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
