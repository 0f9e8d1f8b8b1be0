// What a checkpoint holds and how it is written and read: model.pt, optimizer.pt, rng.pt and
// state.json (with --zero 1, one moments file per rank in place of optimizer.pt). The writer hashes each file as it
// writes it and fsyncs it; the manifest it returns goes to the coordinator, which verifies and publishes the directory.
// Loading verifies every file against the published manifest.json before reading it.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/file_write_mode.h"
#include "dt/v1/checkpoint.pb.h"
#include "trainer/device_copy.h"
#include "trainer/gpt2_model.h"
#include "trainer/zero_optimizer.h"

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
  int64_t epoch_samples = 0;  // where the sampler cut each epoch (0: not recorded, older checkpoints)
  uint64_t seed = 0;
  std::string model_config;  // e.g. "n_embd=64,n_layer=2,..." to refuse a mismatched model
};

// The memory copies of a snapshot into its staging buffers, made after the snapshot's archives
// are built: the sources are the live tensors, so the copy must be complete before anything
// changes them (the next optimizer step). Between the two, training may go on: the forward and
// backward passes only read parameters and moments, so a thread can copy while they run, and the
// training thread helps finish whatever is left when it reaches the optimizer step (as
// zero-overhead checkpointing overlaps its device-to-host copy with the next step). Thread-safe:
// any number of threads may Work() or Complete() at once; every piece is copied exactly once.
// A device's tensors (a GPU's) are copied on the device's side stream instead
// (DeviceToHostCopies), queued when the snapshot is taken.
class SnapshotCopy {
 public:
  // Before any Work(): copy `size` bytes from `from` (inside `source`, kept alive until done).
  void Add(char* to, const char* from, size_t size, const torch::Tensor& source);
  // Queues `to` = `from` (a device tensor) on the device's side stream, at once.
  void AddFromDevice(const torch::Tensor& to, const torch::Tensor& from);
  // After the last Add: the device copies' end is marked.
  void Seal();
  // Copies pieces on the calling thread until none is left to take.
  void Work();
  // Work() on the calling thread and on helper threads on the machine's other cores, then waits
  // for the pieces that other threads took and for the device's copies: when it returns, every
  // byte is copied.
  void Complete();
  // What training needs before its optimizer step changes the sources: the host pieces copied (as
  // Complete), the device's copies ordered before the device's next work, without the host waiting
  // for them. Returns whether the host pieces were already copied.
  bool CompleteBeforeUpdate();
  // Whether every host piece is copied (a device's copies are waited for by Complete).
  bool complete() const;
  bool empty() const { return pieces_.empty() && !device_; }
  size_t pieces() const { return pieces_.size(); }  // the host's

  // Pieces are this size (the last of a tensor smaller), so threads share a large tensor.
  static constexpr size_t kPiece = 4 << 20;

 private:
  struct Piece {
    char* to;
    const char* from;
    size_t size;
  };
  static constexpr size_t kMaxHelpers = 7;
  void CompleteHostPieces();
  std::vector<Piece> pieces_;
  std::vector<torch::Tensor> sources_;
  std::unique_ptr<DeviceToHostCopies> device_;  // null when no tensor is on a device
  std::atomic<size_t> next_{0};                 // the next piece to take
  mutable std::mutex mu_;
  std::condition_variable copied_cv_;
  size_t copied_ = 0;  // pieces finished (guarded by mu_)
};

// What a checkpoint's files hold, as archives ready to serialise: either over the live model and
// optimizer (written at once, the training loop waiting), or a snapshot copied out of them into
// host memory, which a background thread can write while training goes on.
struct CheckpointArchives {
  torch::serialize::OutputArchive model;
  torch::serialize::OutputArchive optimizer;
  torch::Tensor rng;  // the CPU generator's state
  // The model's device's generator state when it is not the CPU (dropout on a GPU draws from the
  // device's generator, so an exact resume needs it too); undefined on CPU.
  torch::Tensor device_rng;
  TrainState state;
  // A ZeRO-1 rank's share (a sharded round): its moments go to `moments_file` in place of
  // optimizer.pt, and only the rank with `model_files` writes model.pt, rng.pt and state.json.
  bool model_files = true;
  std::string moments_file;
  FlatMoments moments;
  int64_t tensor_bytes = 0;  // what the snapshot copied (0 for live archives)
  // A snapshot's host copies still to be made (null when none is pending): the archives hold the
  // staging buffers, which hold the live state only once this is complete. WriteArchives
  // completes it first.
  std::shared_ptr<SnapshotCopy> pending_copy;
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
  // is free, a new one: for a host `t`, one that already holds the copy (`*copied` says which); for
  // a device's, a pinned one the caller copies into.
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

// The tensors an asynchronous snapshot of `model` with AdamW copies, for SnapshotStaging::Reserve:
// parameters, buffers and AdamW's two moments per parameter (not created until the first step;
// they have their parameter's shape).
// Without `with_moments` (a ZeRO-1 rank 0, which copies only the model), the model's alone.
std::vector<torch::Tensor> StagingShapes(Gpt2& model, bool with_moments = true);

// StagingShapes for a ZeRO-1 rank: its two moments' flat buffers, and the model's with `with_model`.
std::vector<torch::Tensor> ZeroStagingShapes(Gpt2& model, const ZeroAdamW& zero, bool with_model);

// Archives over the live tensors: valid until the next optimizer step changes them.
CheckpointArchives LiveArchives(Gpt2& model, torch::optim::Optimizer& optimizer, const TrainState& state);
// A copy of every parameter, buffer and AdamW moment in host memory (what an asynchronous
// checkpoint writes while training goes on), into `staging`'s buffers when given. With
// `defer_copy`, the copies of host tensors into staging buffers are left in `pending_copy` for the
// caller to make (SnapshotCopy) before the live state next changes; without, they are made here,
// on every core.
// UNIMPLEMENTED for an optimizer other than AdamW; RESOURCE_EXHAUSTED when the copy cannot be
// allocated.
absl::StatusOr<CheckpointArchives> SnapshotArchives(Gpt2& model, torch::optim::Optimizer& optimizer,
                                                    const TrainState& state, SnapshotStaging* staging = nullptr,
                                                    bool defer_copy = false);

// A ZeRO-1 rank's share of a sharded round: copies of its moments and, with `with_model` (one
// rank), of the model, into `staging`'s buffers when given. The copies are left in `pending_copy`
// as SnapshotArchives's `defer_copy` leaves them: the caller completes them (or WriteArchives
// does) before the next optimizer step. RESOURCE_EXHAUSTED when the copy cannot be allocated.
absl::StatusOr<CheckpointArchives> ZeroShardArchives(Gpt2& model, const ZeroAdamW& zero, const TrainState& state,
                                                     bool with_model, SnapshotStaging* staging = nullptr);

// Writes model.pt, optimizer.pt, rng.pt and state.json into `dir` (a ZeRO-1 share: what it holds) (completing a
// snapshot's pending copy first), hashing each file as it is written, fsyncs them and the directory, and returns the
// manifest for the coordinator. RESOURCE_EXHAUSTED when the disk is full (the message names the file). `write_mode`:
// how the large files reach the disk (HashingFileWriter).
absl::StatusOr<v1::Manifest> WriteArchives(const std::string& dir, CheckpointArchives& archives,
                                           FileWriteMode write_mode = FileWriteMode::kWriteBehind);

// How dttrainer writes checkpoint files unless told (--checkpoint-io auto): written behind on a
// GPU, whose host cores are free while it trains; around the page cache on the CPU, where the copy
// into the cache takes a core from training (GPT-2 small's 1.5 GB round beside a step on 2 cores:
// 490 MB/s direct, 280-300 MB/s written behind; bench/findings.md).
FileWriteMode CheckpointWriteMode(const torch::Device& device);

// WriteArchives of LiveArchives.
absl::StatusOr<v1::Manifest> WriteCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                             const TrainState& state);

// DATA_LOSS when a listed file is missing or of another size, or a file it reads does not match
// manifest.json (each rank hashes what it reads: CheckpointFiles); FAILED_PRECONDITION when the
// model shape differs from the checkpoint's.
// A checkpoint of ZeRO-1 shares loads too: the moments files are regathered into the optimizer.
absl::StatusOr<TrainState> LoadCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                          torch::Device device = torch::kCPU);
// LoadCheckpoint without the optimizer (a ZeRO-1 run loads its share with LoadZeroMoments).
absl::StatusOr<TrainState> LoadModelCheckpoint(const std::string& dir, Gpt2& model, torch::Device device = torch::kCPU);
// Elements [begin, end) of the checkpoint's AdamW moments over `params` (the loaded model's), from
// its ZeRO-1 moments files (written at any world size; only those that overlap are read) or from an
// unpartitioned optimizer.pt (loaded whole, then cut). FAILED_PRECONDITION when they do not fit the
// model; DATA_LOSS for a file that is not what it should be (only the files read are hashed).
absl::StatusOr<FlatMoments> LoadZeroMoments(const std::string& dir, const std::vector<torch::Tensor>& params,
                                            int64_t begin, int64_t end, const AdamWSettings& settings,
                                            torch::Device device = torch::kCPU);

std::string DescribeConfig(const Gpt2Config& c);

// An exception's message without LibTorch's C++ backtrace (c10::Error appends one to what()).
std::string ExceptionText(const std::exception& e);

// Largest absolute difference between the parameters of two checkpoints' model.pt (for
// `dttrainer ckpt-diff`): per tensor and overall.
absl::StatusOr<std::vector<std::pair<std::string, double>>> CompareModels(const std::string& dir_a,
                                                                          const std::string& dir_b);

}  // namespace dt
