// Data-parallel gradient synchronisation: parameters are broadcast from rank 0 at the start;
// during backward, gradients are packed into buckets (~25 MB, the first ~1 MB so communication
// starts early) in reverse parameter order, and each bucket is all-reduced asynchronously as
// soon as all of its gradients are final (post-accumulate hooks), in the same bucket order on
// every rank. Finish() waits, averages and writes the gradients back. With sync disabled
// (gradient accumulation micro-steps) the hooks do nothing. A group of one does none of this: its
// gradients are the average already.
#pragma once

#include <torch/torch.h>
#include "trainer/comm_group.h"

#include <memory>
#include <vector>

namespace dt {

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::vector<torch::Tensor> parameters, c10::intrusive_ptr<CommGroup> group,
                          int64_t bucket_cap_bytes = 25 << 20, int64_t first_bucket_bytes = 1 << 20);
  ~DistributedDataParallel();

  // Makes every rank's parameters equal to rank 0's.
  void BroadcastParameters();
  // Whether the next backward all-reduces (false on accumulation micro-steps).
  void set_sync(bool sync) { sync_ = sync; }
  // Call before each synchronising backward.
  void Prepare();
  // After backward: waits for every bucket, averages, and writes gradients back.
  void Finish();

  size_t bucket_count() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into parameters_
    std::vector<int64_t> offsets;  // element offset of each param in `flat`
    torch::Tensor flat;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    uint64_t sequence = 0;  // its all-reduce in the process's CollectiveRing
  };
  void OnGradReady(size_t param);
  void LaunchReady();

  std::vector<torch::Tensor> parameters_;
  c10::intrusive_ptr<CommGroup> group_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param → bucket
  std::vector<size_t> slot_of_;    // param → position in its bucket
  std::vector<bool> ready_;        // param → its gradient is in its bucket this step
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive for the hooks
  size_t next_to_launch_ = 0;
  bool sync_ = true;
  bool prepared_ = false;
};

}  // namespace dt
