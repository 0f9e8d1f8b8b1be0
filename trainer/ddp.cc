#include "trainer/ddp.h"

#include "common/collective_ring.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace dt {
namespace {

// Runs a callback after AccumulateGrad wrote a parameter's gradient.
class AfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::vector<torch::Tensor> parameters,
                                                 c10::intrusive_ptr<CommGroup> group, int64_t bucket_cap_bytes,
                                                 int64_t first_bucket_bytes)
    : parameters_(std::move(parameters)), group_(std::move(group)) {
  bucket_of_.resize(parameters_.size());
  ready_.assign(parameters_.size(), false);
  slot_of_.resize(parameters_.size());
  // A group of one has nothing to reduce: no buckets (a second copy of every gradient) and no
  // hooks, so its steps make no copies into buckets and back (320 device copies a step for GPT-2
  // small, 0.7 ms of an 83 ms step on an H200).
  if (group_->getSize() == 1) return;
  // Backward produces gradients roughly in reverse registration order: bucket that way.
  int64_t cap = first_bucket_bytes;
  Bucket current;
  int64_t current_bytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    int64_t elements = 0;
    for (size_t p : current.params) {
      current.offsets.push_back(elements);
      elements += parameters_[p].numel();
    }
    current.flat = torch::zeros({elements}, parameters_[current.params[0]].options());
    buckets_.push_back(std::move(current));
    current = Bucket();
    current_bytes = 0;
    cap = bucket_cap_bytes;
  };
  for (size_t i = parameters_.size(); i-- > 0;) {
    const torch::Tensor& p = parameters_[i];
    bucket_of_[i] = buckets_.size();
    slot_of_[i] = current.params.size();
    current.params.push_back(i);
    current_bytes += p.numel() * p.element_size();
    if (current_bytes >= cap) close();
  }
  close();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(parameters_[i]);
    acc->add_post_hook(std::make_unique<AfterAccumulate>([this, i] { OnGradReady(i); }));
    accumulators_.push_back(std::move(acc));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& acc : accumulators_) acc->post_hooks().clear();
}

void DistributedDataParallel::BroadcastParameters() {
  if (group_->getSize() == 1) return;  // nothing to share
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_parts;
  for (auto& p : parameters_) flat_parts.push_back(p.detach().reshape({-1}));
  torch::Tensor flat = torch::cat(flat_parts);
  std::vector<torch::Tensor> tensors = {flat};
  uint64_t sequence = CollectiveRing::Process().Begin("broadcast", flat.numel() * flat.element_size());
  group_->broadcast(tensors)->wait();
  CollectiveRing::Process().End(sequence);
  int64_t offset = 0;
  for (auto& p : parameters_) {
    p.detach().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

void DistributedDataParallel::Prepare() {
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_to_launch_ = 0;
  prepared_ = true;
}

void DistributedDataParallel::OnGradReady(size_t param) {
  if (!sync_ || !prepared_ || ready_[param]) return;
  ready_[param] = true;
  Bucket& b = buckets_[bucket_of_[param]];
  const torch::Tensor& grad = parameters_[param].grad();
  size_t slot = slot_of_[param];
  torch::Tensor dst = b.flat.narrow(0, b.offsets[slot], parameters_[param].numel());
  if (grad.defined()) {
    dst.copy_(grad.reshape({-1}));
  } else {
    dst.zero_();
  }
  --b.pending;
  LaunchReady();
}

void DistributedDataParallel::LaunchReady() {
  // Buckets go out in index order on every rank, as collectives must match across ranks.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& b = buckets_[next_to_launch_++];
    std::vector<torch::Tensor> tensors = {b.flat};
    b.sequence = CollectiveRing::Process().Begin("all-reduce", b.flat.numel() * b.flat.element_size());
    b.work = group_->allreduce(tensors);
  }
}

void DistributedDataParallel::Finish() {
  if (!sync_) return;
  TORCH_CHECK(prepared_, "DistributedDataParallel::Finish without Prepare");
  // Parameters that took no part in the loss never fire their hook: they contribute zeros.
  for (auto& b : buckets_) {
    if (b.pending == 0) continue;
    for (size_t k = 0; k < b.params.size(); ++k) {
      if (!ready_[b.params[k]]) b.flat.narrow(0, b.offsets[k], parameters_[b.params[k]].numel()).zero_();
    }
    b.pending = 0;
  }
  LaunchReady();
  const double scale = 1.0 / static_cast<double>(group_->getSize());
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.work->wait();
    CollectiveRing::Process().End(b.sequence);
    b.flat.mul_(scale);
    for (size_t k = 0; k < b.params.size(); ++k) {
      torch::Tensor& p = parameters_[b.params[k]];
      torch::Tensor synced = b.flat.narrow(0, b.offsets[k], p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(synced);
      } else {
        p.mutable_grad() = synced.clone();
      }
    }
  }
  prepared_ = false;
}

}  // namespace dt
