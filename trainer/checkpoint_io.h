// What a checkpoint holds and how it is written and read: model.pt, optimizer.pt, rng.pt and
// state.json. The writer hashes each file as it writes it and fsyncs it; the manifest it returns
// goes to the coordinator, which verifies and publishes the directory. Loading verifies every
// file against the published manifest.json before reading it.
#pragma once

#include <torch/torch.h>

#include <string>

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

absl::StatusOr<v1::Manifest> WriteCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                             const TrainState& state);

// DATA_LOSS when a file does not match manifest.json; FAILED_PRECONDITION when the model shape
// differs from the checkpoint's.
absl::StatusOr<TrainState> LoadCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                          torch::Device device = torch::kCPU);

// Verifies a checkpoint directory's files against its manifest.json.
absl::Status VerifyCheckpointFiles(const std::string& dir);

std::string DescribeConfig(const Gpt2Config& c);

// Largest absolute difference between the parameters of two checkpoints' model.pt (for
// `dttrainer ckpt-diff`): per tensor and overall.
absl::StatusOr<std::vector<std::pair<std::string, double>>> CompareModels(const std::string& dir_a,
                                                                          const std::string& dir_b);

}  // namespace dt
