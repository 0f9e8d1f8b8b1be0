#include "trainer/checkpoint_rounds.h"

#include <cstdlib>
#include <memory>
#include <utility>

#include <ATen/record_function.h>

#include "absl/strings/str_cat.h"
#include "common/background_thread.h"
#include "common/log.h"

namespace dt {
namespace {

// The round's thread and the threads it starts (the archive writers and their hash helpers inherit
// a Linux thread's nice value) yield to training: where cores are short, the background write
// takes the time training leaves instead of slowing its steps. Training never waits longer for a
// round than before: a round still writing when the next begins is waited for, and then has the
// cores to itself.
void YieldToTraining() { YieldToForegroundWork(); }

}  // namespace

CheckpointRounds::~CheckpointRounds() {
  if (preparing_.joinable()) preparing_.join();
  if (in_flight_.valid()) in_flight_.wait();
}

void CheckpointRounds::PrepareStaging(std::vector<torch::Tensor> like) {
  if (!async_ || preparing_.joinable()) return;
  preparing_ = std::thread([this, like = std::move(like)] { staging_.Reserve(like); });
}

absl::StatusOr<absl::Duration> CheckpointRounds::Start(Gpt2& model, torch::optim::Optimizer& optimizer,
                                                       const TrainState& state) {
  if (in_flight_.valid()) finished_ = in_flight_.get();
  pending_copy_.reset();  // the round that made it is over
  if (preparing_.joinable()) preparing_.join();
  absl::Time start = absl::Now();
  absl::StatusOr<v1::BeginCheckpointResponse> round = [&] {
    RECORD_USER_SCOPE("dt::begin_checkpoint_rpc");
    return agent_.BeginCheckpoint(state.step);
  }();
  if (!round.ok()) return round.status();
  bool writer = round->writer_rank() == agent_.rank();
  if (!async_) {
    std::shared_ptr<CheckpointArchives> live;
    if (writer) live = std::make_shared<CheckpointArchives>(LiveArchives(model, optimizer, state));
    return Launch(*round, state.step, std::move(live), start, "");
  }
  std::shared_ptr<CheckpointArchives> snapshot;
  if (writer) {
    absl::StatusOr<CheckpointArchives> copied =
        SnapshotArchives(model, optimizer, state, &staging_, /*defer_copy=*/true);
    if (!copied.ok()) {
      // No room for a copy (or an optimizer without one): this round is written in place.
      DT_LOG(Warning) << "checkpoint at step " << state.step << " written synchronously: " << copied.status();
      copied = LiveArchives(model, optimizer, state);
      std::promise<Outcome> done;
      done.set_value(Finish(*round, state.step, &*copied, start));
      in_flight_ = done.get_future();
      return absl::Now() - start;
    }
    snapshot = std::make_shared<CheckpointArchives>(std::move(*copied));
  }
  return Launch(*round, state.step, std::move(snapshot), start, "");
}

absl::StatusOr<absl::Duration> CheckpointRounds::StartZero(Gpt2& model, const ZeroAdamW& zero,
                                                           const TrainState& state) {
  if (in_flight_.valid()) finished_ = in_flight_.get();
  pending_copy_.reset();
  if (preparing_.joinable()) preparing_.join();
  absl::Time start = absl::Now();
  absl::StatusOr<v1::BeginCheckpointResponse> round =
      agent_.BeginCheckpoint(state.step, absl::ZeroDuration(), /*sharded=*/true);
  if (!round.ok()) return round.status();
  absl::StatusOr<CheckpointArchives> copied =
      ZeroShardArchives(model, zero, state, /*with_model=*/agent_.rank() == 0, async_ ? &staging_ : nullptr);
  if (!copied.ok()) {
    (void)agent_.AbortCheckpoint(round->round_id(), copied.status().ToString());
    Outcome failed;
    failed.step = state.step;
    failed.committed = copied.status();
    failed.took = absl::Now() - start;
    std::promise<Outcome> done;
    done.set_value(std::move(failed));
    in_flight_ = done.get_future();
    return absl::Now() - start;
  }
  return Launch(*round, state.step, std::make_shared<CheckpointArchives>(std::move(*copied)), start, zero.LayoutJson());
}

absl::Duration CheckpointRounds::Launch(const v1::BeginCheckpointResponse& round, int64_t step,
                                        std::shared_ptr<CheckpointArchives> snapshot, absl::Time start,
                                        const std::string& layout_json) {
  if (!async_) {
    std::promise<Outcome> done;
    done.set_value(Finish(round, step, snapshot.get(), start, layout_json));
    in_flight_ = done.get_future();
    return absl::Now() - start;
  }
  if (snapshot) pending_copy_ = snapshot->pending_copy;
  absl::Duration paused = absl::Now() - start;
  in_flight_ = std::async(std::launch::async, [this, round, step, snapshot, start, layout_json] {
    YieldToTraining();
    // One thread copies while training goes on (AwaitSnapshot brings every core when training
    // needs the copy finished); WriteArchives waits for the last pieces.
    if (snapshot && snapshot->pending_copy) snapshot->pending_copy->Work();
    return Finish(round, step, snapshot.get(), start, layout_json);
  });
  return paused;
}

absl::Duration CheckpointRounds::AwaitSnapshot() {
  RECORD_USER_SCOPE("dt::await_snapshot");  // named in a trace (--profile-trace), as the round's other host work
  if (!pending_copy_) return absl::ZeroDuration();
  absl::Time start = absl::Now();
  bool already = pending_copy_->CompleteBeforeUpdate();
  pending_copy_.reset();
  return already ? absl::ZeroDuration() : absl::Now() - start;
}

CheckpointRounds::Outcome CheckpointRounds::Finish(const v1::BeginCheckpointResponse& round, int64_t step,
                                                   CheckpointArchives* archives, absl::Time start,
                                                   const std::string& layout_json) {
  Outcome out;
  out.step = step;
  if (archives == nullptr) {
    if (before_commit_) before_commit_(step);
    out.committed = agent_.CommitCheckpoint(round.round_id(), nullptr);
  } else {
    absl::StatusOr<v1::Manifest> manifest = WriteArchives(round.partial_dir(), *archives, write_mode_);
    if (!manifest.ok()) {
      (void)agent_.AbortCheckpoint(round.round_id(), manifest.status().ToString());
      out.disk_full = absl::IsResourceExhausted(manifest.status());
      out.committed = manifest.status();
    } else {
      if (step == exit_before_commit_at_ && archives->model_files) {  // the writer (of a sharded round: rank 0)
        DT_LOG(Warning) << "--exit-while-checkpointing " << step << ": vanishing before the commit (fault injection)";
        std::_Exit(137);
      }
      if (before_commit_) before_commit_(step);
      out.committed = agent_.CommitCheckpoint(round.round_id(), &*manifest, layout_json);
    }
  }
  out.took = absl::Now() - start;
  return out;
}

std::optional<CheckpointRounds::Outcome> CheckpointRounds::Poll() {
  if (finished_) return std::exchange(finished_, std::nullopt);
  if (in_flight_.valid() && in_flight_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    return in_flight_.get();
  }
  return std::nullopt;
}

std::optional<CheckpointRounds::Outcome> CheckpointRounds::Wait() {
  if (finished_) return std::exchange(finished_, std::nullopt);
  if (in_flight_.valid()) return in_flight_.get();
  return std::nullopt;
}

}  // namespace dt
