// The device-to-host half of an asynchronous checkpoint on a GPU: the snapshot's copies run on a
// side stream of the device, into pinned host buffers, so they overlap the next step's forward and
// backward passes instead of stalling training at the step boundary. The training stream then waits
// for them on the device (not the host) before its optimizer step changes what they copy; the
// checkpoint's writer waits for them on the host before it serialises the buffers.
//
// Written against c10's device-generic stream and event interface, so it compiles with any
// LibTorch (Debian's CPU build too) and runs wherever a tensor lives on a device with streams.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace dt {

// Which of the device's streams copies run on.
enum class CopyStream {
  // A side stream, starting after what the current stream has queued so far: the copies overlap
  // the current stream's later work.
  kSide,
  // The current stream, in its order. Copies later queued on a side stream start after these: a
  // few bytes read on the current stream cannot wait behind a checkpoint's 1.5 GB queued on a
  // side stream just after (an H200 ran them after all 456 of the round's copies, 30 ms late).
  kCurrent,
};

class DeviceToHostCopies {
 public:
  // Copies from `device`, starting after everything its current stream has queued so far.
  explicit DeviceToHostCopies(torch::Device device, CopyStream stream = CopyStream::kSide);
  // Copies queued but never sealed (a snapshot that failed half-way) are waited for: their buffers
  // and sources must not be reused while the device still copies.
  ~DeviceToHostCopies();
  DeviceToHostCopies(const DeviceToHostCopies&) = delete;
  DeviceToHostCopies& operator=(const DeviceToHostCopies&) = delete;
  // Queues `to` = `from` (`to`'s shape; `from` on this device, the same number of elements) on the
  // copies' stream. `to`: host memory, pinned for the copy to run asynchronously (a pageable one makes
  // the host wait for it).
  void Add(const torch::Tensor& to, const torch::Tensor& from);
  // After the last Add: marks where the copies end.
  void Seal();
  // The device's current stream waits, on the device, for the copies: work queued on it afterwards
  // may change their sources. The host does not wait.
  void OrderBeforeNextDeviceWork() const;
  // Waits on the host until every copy has finished.
  void Wait() const;
  // Whether every copy has finished (after Seal), without waiting.
  bool Done() const;

 private:
  c10::impl::VirtualGuardImpl guard_;
  torch::Device device_;
  c10::Stream stream_;  // the copies'
  c10::Event copied_;
  bool sealed_ = false;
  std::vector<torch::Tensor> sources_;  // alive until copied (the live state usually is anyway)
};

// A few numbers of a step (its loss and gradient norm, the ranks' preemption agreement) on their
// way to the host without making the host wait for the device: on a device they are copied into
// pinned memory behind the work queued so far, and Values() waits for that copy alone, usually
// done by the time the next step is queued. Waiting for them at once would idle the device while
// the host logs, reports and queues the next step. On the CPU they are there at once.
class LateRead {
 public:
  // `values`: any shape and floating or integral type, read as doubles in their flat order.
  // `stream`: a read that a checkpoint round may follow at once goes on the current stream (a
  // round's copies then wait for it); kSide keeps even its few bytes off the current stream,
  // where they could wait behind a round's copies already queued.
  LateRead(const torch::Tensor& values, CopyStream stream);
  std::vector<double> Values() const;

 private:
  torch::Tensor host_;
  std::unique_ptr<DeviceToHostCopies> copy_;  // null on the CPU
};

}  // namespace dt
