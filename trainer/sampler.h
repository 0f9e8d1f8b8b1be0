// Which samples each rank trains on: a permutation of all samples per epoch (from the seed and
// the epoch, the same on every rank), rank r taking every world-th one starting at r (as
// torch's DistributedSampler does), in batches, dropping what does not fill a batch on every
// rank. So rank r's batch k of a W-rank run is a disjoint slice of batch k of a one-rank run with
// W times the batch size. The position (epoch, batch) goes into checkpoints. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dt {

class DistributedSampler {
 public:
  // `global_batch` (0: world_size x batch_size) rounds an epoch down to whole global batches, so
  // runs of any shape with the same global batch see the same samples in each epoch, in the same
  // optimizer steps; it must be a multiple of world_size x batch_size.
  DistributedSampler(int64_t num_samples, int world_size, int rank, int batch_size, uint64_t seed,
                     int64_t global_batch = 0);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Samples in an epoch, every rank's together: where epochs are cut.
  int64_t samples_per_epoch() const { return batches_per_epoch_ * world_size_ * batch_size_; }
  // Sample indices of this rank's batch `batch` (0-based) in `epoch` (0-based).
  std::vector<int64_t> Batch(int64_t epoch, int64_t batch);

 private:
  void Shuffle(int64_t epoch);

  int64_t num_samples_;
  int world_size_;
  int rank_;
  int batch_size_;
  uint64_t seed_;
  int64_t batches_per_epoch_;
  int64_t shuffled_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// What a resume says when the checkpoint's epochs were cut at `then` samples and this run's are
// cut at `now` (without --global-batch-size an epoch is cut at whole world x batch, so another
// shape can cut it elsewhere): the data order differs from the uninterrupted run's from sample
// min(then, now) of `epoch` on. Empty when they agree, or when `then` is 0 (a checkpoint from
// before epoch lengths were recorded).
std::string EpochCutChange(int64_t then, int64_t now, int64_t epoch);

// The micro-steps per optimizer step that make `global_batch` samples from `world_size` ranks of
// `batch_size` each: INVALID_ARGUMENT with the arithmetic when it does not divide, or when it
// would take more than kMaxMicroSteps.
inline constexpr int64_t kMaxMicroSteps = 1 << 20;
absl::StatusOr<int> MicroStepsForGlobalBatch(int64_t global_batch, int batch_size, int world_size);

}  // namespace dt
