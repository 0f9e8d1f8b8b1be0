// What a checkpoint holds and how it is written and read: model.pt, optimizer.pt, rng.pt and
// state.json. The writer hashes each file as it writes it and fsyncs it; the manifest it returns
// goes to the coordinator, which verifies and publishes the directory. Loading verifies every
// file against the published manifest.json before reading it.
#pragma once

#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dt/v1/checkpoint.pb.h"
#include "trainer/gpt2_model.h"

namespace dt {

struct TrainState {
  int64_t step = 0;   // optimizer steps taken
  int64_t epoch = 0;  // sampler position: the next micro-batch is (epoch, batch), in
  int64_t batch = 0;  //   units of world × batch size samples
  int64_t tokens_seen = 0;
  int64_t samples_seen = 0;
  int world_size = 0;
  int batch_size = 0;
  int grad_accum = 1;
  uint64_t seed = 0;
  std::string model_config;  // e.g. "n_embd=64,n_layer=2,..." to refuse a mismatched model
};

// What a checkpoint's files hold, as archives ready to serialise: either over the live model and
// optimizer (written at once, the training loop waiting), or a snapshot copied out of them into
// host memory, which a background thread can write while training goes on.
struct CheckpointArchives {
  torch::serialize::OutputArchive model;
  torch::serialize::OutputArchive optimizer;
  torch::Tensor rng;  // the CPU generator's state
  TrainState state;
  int64_t tensor_bytes = 0;  // what the snapshot copied (0 for live archives)
};

// Host buffers that snapshots copy into, kept from one round to the next: allocating and first
// touching gigabytes costs several times more than copying into memory already mapped (3.5 s
// against 0.1 s for GPT-2 small's 1.5 GB here). Buffers are pooled by shape and type; Reserve()
// can map them ahead of the first round, on another thread. One round at a time uses them
// (CheckpointRounds keeps at most one in flight).
class SnapshotStaging {
 public:
  // Allocates and touches a buffer for each (shape, type), unless the pool holds one already.
  void Reserve(const std::vector<torch::Tensor>& like);
  // Starts a snapshot: every buffer is free again.
  void BeginSnapshot();
  // A free buffer of `t`'s shape and type, claimed, for a copy of `t` the caller makes; when none
  // is free, a new buffer that already holds the copy (`*copied` says which).
  torch::Tensor Claim(const torch::Tensor& t, bool* copied);
  // Ends a snapshot: buffers it did not use are dropped.
  void EndSnapshot();
  int64_t bytes() const;

 private:
  struct Buffer {
    torch::Tensor host;
    bool used = false;
  };
  mutable std::mutex mu_;  // Reserve may run on another thread
  std::vector<Buffer> buffers_;
};

// Archives over the live tensors: valid until the next optimizer step changes them.
CheckpointArchives LiveArchives(Gpt2& model, torch::optim::Optimizer& optimizer, const TrainState& state);
// A copy of every parameter, buffer and AdamW moment in host memory (the only pause an
// asynchronous checkpoint costs), into `staging`'s buffers when given. UNIMPLEMENTED for an
// optimizer other than AdamW; RESOURCE_EXHAUSTED when the copy cannot be allocated.
absl::StatusOr<CheckpointArchives> SnapshotArchives(Gpt2& model, torch::optim::Optimizer& optimizer,
                                                    const TrainState& state, SnapshotStaging* staging = nullptr);

// Writes model.pt, optimizer.pt, rng.pt and state.json into `dir`, hashing each file as it is
// written, fsyncs them and the directory, and returns the manifest for the coordinator.
// RESOURCE_EXHAUSTED when the disk is full (the message names the file).
absl::StatusOr<v1::Manifest> WriteArchives(const std::string& dir, CheckpointArchives& archives);

// WriteArchives of LiveArchives.
absl::StatusOr<v1::Manifest> WriteCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                             const TrainState& state);

// DATA_LOSS when a file does not match manifest.json; FAILED_PRECONDITION when the model shape
// differs from the checkpoint's.
absl::StatusOr<TrainState> LoadCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                          torch::Device device = torch::kCPU);

std::string DescribeConfig(const Gpt2Config& c);

// An exception's message without LibTorch's C++ backtrace (c10::Error appends one to what()).
std::string ExceptionText(const std::exception& e);

// Largest absolute difference between the parameters of two checkpoints' model.pt (for
// `dttrainer ckpt-diff`): per tensor and overall.
absl::StatusOr<std::vector<std::pair<std::string, double>>> CompareModels(const std::string& dir_a,
                                                                          const std::string& dir_b);

}  // namespace dt
