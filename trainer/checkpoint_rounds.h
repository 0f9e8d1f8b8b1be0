// One rank's part in checkpoint rounds. A round starts at a step boundary with BeginCheckpoint
// (every rank arrives; the coordinator names the writer). Synchronous rounds then write and commit
// while training waits. Asynchronous rounds (the default, as torch.distributed.checkpoint's
// async_save) copy the model and optimizer into host memory on a thread while the next step's
// forward and backward passes run (they only read what is copied); training waits for the copy
// only if it reaches the optimizer step first. The thread then writes, hashes, fsyncs and commits
// the copy while training goes on, and the other ranks wait for the commit on a thread as well. At most one round is in
// flight: starting the next waits for it. The host copy's buffers are kept for the next round (the memory of the model
// and optimizer once more, for the run's life). A crash mid-write leaves `latest` on the previous complete checkpoint.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/agent.h"
#include "trainer/checkpoint_io.h"

namespace dt {

class CheckpointRounds {
 public:
  struct Outcome {
    int64_t step = 0;
    absl::StatusOr<v1::CheckpointInfo> committed = absl::UnknownError("not committed");
    absl::Duration took;     // from the round's start to its commit
    bool disk_full = false;  // the writer ran out of space: the run must stop
  };

  // `exit_before_commit_at`: fault injection: the writer of the round at that step vanishes
  // (exit 137, no cleanup) after writing every file, before the commit (0: never). `write_mode`:
  // WriteArchives's.
  CheckpointRounds(Agent& agent, bool async, int64_t exit_before_commit_at = 0,
                   FileWriteMode write_mode = FileWriteMode::kWriteBehind)
      : agent_(agent), async_(async), exit_before_commit_at_(exit_before_commit_at), write_mode_(write_mode) {}
  ~CheckpointRounds();  // waits for the round in flight

  // Starts a round at `state.step` (waiting first for the one in flight, whose outcome is then
  // returned by the next Poll or Wait). Returns how long training was paused. A BeginCheckpoint
  // failure is returned (the generation is failing). An asynchronous round's writer may still be
  // copying the state into host memory when this returns (on the round's thread, overlapping the
  // next step's forward and backward passes): call AwaitSnapshot before the model or optimizer
  // next changes.
  absl::StatusOr<absl::Duration> Start(Gpt2& model, torch::optim::Optimizer& optimizer, const TrainState& state);
  // The same for a ZeRO-1 run: a sharded round in which every rank writes its moments (rank 0 the
  // model too) and commits them with the partition as the layout. A share that cannot be copied
  // aborts the round (its outcome says why); training goes on.
  absl::StatusOr<absl::Duration> StartZero(Gpt2& model, const ZeroAdamW& zero, const TrainState& state);
  // Returns once the round's copy of the host's state is complete, helping to make it on every
  // core, and once a device's copies are ordered before the device's next work (the device waits
  // for them, the host does not); returns how long the host waited (zero when nothing was left to
  // copy). The model and optimizer may change after it.
  absl::Duration AwaitSnapshot();
  // Maps the host buffers of asynchronous rounds on a thread, ahead of the first round (which
  // would otherwise pay for it): one for each of `like`'s shapes. Call on the rank that will
  // likely write (the lowest); no-op for synchronous rounds.
  void PrepareStaging(std::vector<torch::Tensor> like);
  // The outcome of a round that has finished, without waiting; nullopt when none has.
  std::optional<Outcome> Poll();
  // The outcome of the round in flight (or of one that finished unseen), waiting for it.
  std::optional<Outcome> Wait();

  bool async() const { return async_; }

  // Runs before this rank commits a round, on the round's thread when asynchronous, with the
  // round's step: the trainer stores its metrics up to that step there, off the training loop.
  void SetBeforeCommit(std::function<void(int64_t step)> hook) { before_commit_ = std::move(hook); }

 private:
  // Writes (the writer) and commits; runs on the round's thread when asynchronous.
  Outcome Finish(const v1::BeginCheckpointResponse& round, int64_t step, CheckpointArchives* archives, absl::Time start,
                 const std::string& layout_json = "");
  // Writes and commits `snapshot` at once (synchronous rounds) or on the round's thread.
  absl::Duration Launch(const v1::BeginCheckpointResponse& round, int64_t step,
                        std::shared_ptr<CheckpointArchives> snapshot, absl::Time start, const std::string& layout_json);

  Agent& agent_;
  const bool async_;
  const int64_t exit_before_commit_at_;
  const FileWriteMode write_mode_;
  SnapshotStaging staging_;                     // used by one round at a time: the next starts after it
  std::shared_ptr<SnapshotCopy> pending_copy_;  // the round's copy, until AwaitSnapshot
  std::thread preparing_;                       // PrepareStaging's; joined before the first round
  std::future<Outcome> in_flight_;
  std::optional<Outcome> finished_;  // a round waited for by Start, not yet handed out
  std::function<void(int64_t step)> before_commit_;
};

}  // namespace dt
