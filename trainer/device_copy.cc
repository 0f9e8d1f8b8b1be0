#include "trainer/device_copy.h"

#include <c10/core/StreamGuard.h>

#include <chrono>
#include <thread>

namespace dt {

DeviceToHostCopies::DeviceToHostCopies(torch::Device device)
    : guard_(device.type()), device_(device), side_(guard_.getStreamFromGlobalPool(device)), copied_(device.type()) {
  // The side stream starts where the training stream is: the step that just ended may still be
  // running on the device, and its optimizer step writes what is copied.
  c10::Event ready(device.type());
  ready.record(guard_.getStream(device));
  ready.block(side_);
}

void DeviceToHostCopies::Add(const torch::Tensor& to, const torch::Tensor& from) {
  c10::StreamGuard on_side(side_);
  to.copy_(from, /*non_blocking=*/true);
  sources_.push_back(from);
}

void DeviceToHostCopies::Seal() { copied_.record(side_); }

void DeviceToHostCopies::OrderBeforeNextDeviceWork() const { copied_.block(guard_.getStream(device_)); }

bool DeviceToHostCopies::done() const { return copied_.query(); }

void DeviceToHostCopies::Wait() const {
  // c10::Event has no blocking wait in LibTorch 1.13; the writer's thread polls (a 1.5 GB copy
  // takes tens of milliseconds).
  while (!copied_.query()) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

}  // namespace dt
