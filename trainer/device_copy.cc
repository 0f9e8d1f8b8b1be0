#include "trainer/device_copy.h"

#include <ATen/record_function.h>
#include <c10/core/StreamGuard.h>

#include <chrono>
#include <thread>

namespace dt {

DeviceToHostCopies::DeviceToHostCopies(torch::Device device, CopyStream stream)
    : guard_(device.type()),
      device_(device),
      stream_(stream == CopyStream::kSide ? guard_.getStreamFromGlobalPool(device) : guard_.getStream(device)),
      copied_(device.type()) {
  if (stream == CopyStream::kCurrent) return;
  // The side stream starts where the training stream is: the step that just ended may still be
  // running on the device, and its optimizer step writes what is copied.
  c10::Event ready(device.type());
  ready.record(guard_.getStream(device));
  ready.block(stream_);
}

DeviceToHostCopies::~DeviceToHostCopies() {
  try {
    if (!sealed_) Seal();
    Wait();
  } catch (const std::exception&) {
    // The device failed (its error surfaces in training too): nothing is left to wait for.
  }
}

void DeviceToHostCopies::Add(const torch::Tensor& to, const torch::Tensor& from) {
  TORCH_CHECK(from.device() == device_, "a snapshot's device copies come from one device: ", from.device(), " is not ",
              device_);
  c10::StreamGuard on_stream(stream_);
  // Reshaped on the copies' stream: a reshape that copies must come after a side stream's wait too.
  to.copy_(from.reshape(to.sizes()), /*non_blocking=*/true);
  sources_.push_back(from);
}

void DeviceToHostCopies::Seal() {
  copied_.record(stream_);
  sealed_ = true;
}

void DeviceToHostCopies::OrderBeforeNextDeviceWork() const { copied_.block(guard_.getStream(device_)); }

void DeviceToHostCopies::Wait() const {
  RECORD_USER_SCOPE("dt::device_to_host_wait");
  // c10::Event has no blocking wait in LibTorch 1.13; the writer's thread polls (a 1.5 GB copy
  // takes tens of milliseconds).
  while (!Done()) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

bool DeviceToHostCopies::Done() const { return copied_.query(); }

LateRead::LateRead(const torch::Tensor& values, CopyStream stream) {
  torch::Tensor flat = values.detach().reshape({-1}).to(torch::kDouble);
  if (flat.device().is_cpu()) {
    host_ = flat.clone();  // the caller may change `values` afterwards
    return;
  }
  host_ = torch::empty({flat.numel()}, torch::TensorOptions().dtype(torch::kDouble).pinned_memory(true));
  copy_ = std::make_unique<DeviceToHostCopies>(flat.device(), stream);
  copy_->Add(host_, flat);
  copy_->Seal();
}

std::vector<double> LateRead::Values() const {
  if (copy_) copy_->Wait();
  const double* data = host_.data_ptr<double>();
  return std::vector<double>(data, data + host_.numel());
}

}  // namespace dt
