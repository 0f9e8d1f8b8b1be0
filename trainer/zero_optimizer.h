// ZeRO stage 1 (as DeepSpeed's stage 1 and torch's ZeroRedundancyOptimizer): AdamW's two moments
// partitioned across the ranks of the data-parallel group, so each rank keeps 1/world of them.
//
// The parameters, flattened one after another in the model's order, are cut into `world`
// contiguous ranges of ceil(numel / world) elements (the last shorter). Rank r keeps the moments of
// range r only and steps those elements; an all-gather then gives every rank the others' updated
// ranges. The gradients arrive all-reduced (DDP; Gloo has no reduce-scatter), and AdamW is
// elementwise, so every element is stepped exactly as the unpartitioned AdamW steps it: the losses
// are --zero 0's.
//
// A checkpoint holds one moments file per rank (its range, with the range's bounds), so a run can
// resume at another world size: each rank regathers its new range from the files that cover it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/comm_group.h"

namespace dt {

// dttrainer's AdamW: weight decay on matrices only (not on biases and LayerNorm).
struct AdamWSettings {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double weight_decay = 0.1;
};

// AdamW's moments of elements [begin, end) of the flattened parameters: a ZeRO-1 rank's share, or
// (0, numel) all of them. On the CPU, float.
struct FlatMoments {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t numel = 0;  // of all the parameters
  int64_t step = 0;   // AdamW's step count; 0: no step taken (the moments are zeros)
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
};

// Rank `rank`'s range of `world` over `numel` elements: ceil(numel / world) each, the last ones
// shorter (empty when numel < world).
std::pair<int64_t, int64_t> ZeroRange(int64_t numel, int rank, int world);

// Elements of all of `params` together (the length of their flattening).
int64_t TotalElements(const std::vector<torch::Tensor>& params);

// The name of rank `rank`'s moments file in a checkpoint of `world` ranks.
std::string ZeroMomentsFileName(int rank, int world);
// Whether `name` is such a file.
bool IsZeroMomentsFileName(const std::string& name);

// `m` as a LibTorch archive (a checkpoint's file).
torch::serialize::OutputArchive MomentsArchive(const FlatMoments& m);
// Reads a file SerializeMoments wrote. DATA_LOSS when it is not one.
absl::StatusOr<FlatMoments> ReadMomentsFile(const std::string& path);

// Elements [begin, end) assembled from `parts` (the ranges of any world size, e.g. a checkpoint's
// files). FAILED_PRECONDITION, saying why, when the parts disagree on numel or step, or leave part
// of the range uncovered.
absl::StatusOr<FlatMoments> Regather(const std::vector<FlatMoments>& parts, int64_t begin, int64_t end);

// The moments of an unpartitioned AdamW over `params` (its state, flattened in their order), and
// the reverse: sets its state from `all` (every element), as if it had taken `all.step` steps.
// FAILED_PRECONDITION when `all` does not cover the parameters.
FlatMoments MomentsOfAdamW(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& params);
absl::Status SetAdamWMoments(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& params,
                             const FlatMoments& all);

// dttrainer's unpartitioned AdamW over `params`, in its two groups.
// Bytes of the moments `optimizer` holds now (none before its first step): what a rank's
// optimizer state costs it in memory.
int64_t AdamWStateBytes(torch::optim::AdamW& optimizer);
std::unique_ptr<torch::optim::AdamW> MakeAdamW(const std::vector<torch::Tensor>& params, const AdamWSettings& s);

// One step of `optimizer`, computed as torch::optim::AdamW::step computes it, but in multi-tensor
// (_foreach) kernels over groups of parameters: on a GPU, LibTorch's ten kernels per parameter
// (1,500 for GPT-2 small) kept the device idle while the host queued them. The moments and step
// counts stay in the optimizer's state, so checkpoints are unchanged. amsgrad is not offered.
// On a CUDA device with LibTorch >= 2.1 it is ATen's fused AdamW kernel (one pass over the
// parameters instead of nine), the same arithmetic up to rounding.
void StepAdamW(torch::optim::AdamW& optimizer);

// Scales the gradients of `params` so that their total 2-norm is at most `max_norm`, as
// torch::nn::utils::clip_grad_norm_ does, and returns that norm (before clipping) as a 0-dim
// tensor on their device: not read back, so that the host queues the optimizer's kernels while
// the device still runs the backward pass.
torch::Tensor ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm);

class ZeroAdamW {
 public:
  // Elements of each rank's range per all-gather of ShareParameters (4 MiB of float).
  static constexpr int64_t kShareBucketElements = int64_t{1} << 20;

  // `params` must stay the model's (their storage is stepped in place): build this after the
  // model's checkpoint is loaded.
  ZeroAdamW(std::vector<torch::Tensor> params, int rank, int world, const AdamWSettings& settings,
            int64_t share_bucket_elements = kShareBucketElements);

  // AdamW at `lr` on this rank's range, reading the parameters' (all-reduced) gradients.
  void Step(double lr);
  // Every rank's updated range to every rank (a collective: every rank calls it after Step).
  void ShareParameters(CommGroup& group);

  // Copies of this rank's moments (a checkpoint's share); safe to write while training goes on.
  FlatMoments Moments() const;
  // The live moments, as AdamW keeps them: one part per parameter the range touches, at `at`
  // elements into the range. None before the first step (the moments are zeros then). Valid
  // until the next Step; for a copy made off the training thread (ZeroShardArchives).
  struct MomentPart {
    torch::Tensor exp_avg;
    torch::Tensor exp_avg_sq;
    int64_t at;
  };
  std::vector<MomentPart> MomentParts() const;
  // Sets this rank's moments from `mine` (which must be exactly its range).
  absl::Status LoadMoments(const FlatMoments& mine);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t numel() const { return numel_; }
  int64_t step() const { return step_; }  // AdamW steps taken (loaded ones included)
  int64_t StateBytes() const { return adamw_ ? AdamWStateBytes(*adamw_) : 0; }  // this rank's moments
  int rank() const { return rank_; }
  int world() const { return world_; }
  // The checkpoint's layout document: {"zero": 1, "world_size", "numel", "ranges": [[b, e], ...]}.
  std::string LayoutJson() const;

 private:
  // A part of parameter `param` (elements [offset, offset + length) of it, flattened), at
  // `flat` in the flattened parameters.
  struct Segment {
    size_t param;
    int64_t offset;
    int64_t length;
    int64_t flat;
  };
  std::vector<Segment> SegmentsOf(int64_t begin, int64_t end) const;

  std::vector<torch::Tensor> params_;
  const int rank_;
  const int world_;
  int64_t numel_ = 0;
  int64_t chunk_ = 0;
  int64_t begin_ = 0;
  int64_t end_ = 0;
  int64_t step_ = 0;
  std::vector<Segment> mine_;                   // this rank's range, by parameter
  std::vector<torch::Tensor> pieces_;           // views of mine_ in the parameters: what AdamW steps
  std::unique_ptr<torch::optim::AdamW> adamw_;  // over pieces_; null when the range is empty
  int64_t bucket_ = 1;                          // elements of each rank per all-gather
  std::vector<torch::Tensor> gathered_;         // world buffers of bucket_ elements
  torch::Tensor send_;                          // a bucket of this rank's range, packed
};

}  // namespace dt
