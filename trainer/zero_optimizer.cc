#include "trainer/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/collective_ring.h"

namespace dt {
namespace {

// AdamW's state is keyed by the parameter's TensorImpl: as a string in LibTorch 1.x, as the
// pointer in 2.x.
template <typename Map>
typename Map::key_type StateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;  // as LibTorch 1.x's AdamW writes it (c10::guts::to_string, gone in 2.11)
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

using AdamWStateMap = std::remove_reference_t<decltype(std::declval<torch::optim::AdamW&>().state())>;

const torch::optim::AdamWParamState* StateOf(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto it = optimizer.state().find(StateKey<AdamWStateMap>(p));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<const torch::optim::AdamWParamState*>(it->second.get());
}

void SetState(torch::optim::AdamW& optimizer, const torch::Tensor& p, int64_t step, const torch::Tensor& exp_avg,
              const torch::Tensor& exp_avg_sq) {
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->step(step);
  // Copies on the parameter's device, shaped as it is: AdamW steps them in place beside it.
  state->exp_avg(exp_avg.reshape(p.sizes()).to(p.options(), /*non_blocking=*/false, /*copy=*/true));
  state->exp_avg_sq(exp_avg_sq.reshape(p.sizes()).to(p.options(), /*non_blocking=*/false, /*copy=*/true));
  optimizer.state()[StateKey<AdamWStateMap>(p)] = std::move(state);
}

// AdamW over two groups: `decay` with the weight decay, `no_decay` without. Without
// `keep_empty_groups`, an empty group is left out (null when both are empty); kept, optimizer.pt
// always has the two groups its readers expect.
std::unique_ptr<torch::optim::AdamW> AdamWOver(std::vector<torch::Tensor> decay, std::vector<torch::Tensor> no_decay,
                                               const AdamWSettings& s, bool keep_empty_groups) {
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(s.lr).betas({s.beta1, s.beta2}).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (keep_empty_groups || !decay.empty()) groups.emplace_back(decay, options(s.weight_decay));
  if (keep_empty_groups || !no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  if (groups.empty()) return nullptr;
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(s.lr));
}

FlatMoments ZeroMoments(int64_t begin, int64_t end, int64_t numel, int64_t step) {
  FlatMoments m;
  m.begin = begin;
  m.end = end;
  m.numel = numel;
  m.step = step;
  m.exp_avg = torch::zeros({end - begin}, torch::kFloat);
  m.exp_avg_sq = torch::zeros({end - begin}, torch::kFloat);
  return m;
}

}  // namespace

int64_t TotalElements(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

std::pair<int64_t, int64_t> ZeroRange(int64_t numel, int rank, int world) {
  int64_t chunk = (numel + world - 1) / world;
  int64_t begin = std::min(numel, chunk * rank);
  return {begin, std::min(numel, begin + chunk)};
}

std::string ZeroMomentsFileName(int rank, int world) {
  return absl::StrFormat("optimizer-zero1-rank%05d-of-%05d.pt", rank, world);
}

bool IsZeroMomentsFileName(const std::string& name) {
  return absl::StartsWith(name, "optimizer-zero1-rank") && absl::EndsWith(name, ".pt");
}

torch::serialize::OutputArchive MomentsArchive(const FlatMoments& m) {
  torch::serialize::OutputArchive a;
  a.write("begin", c10::IValue(m.begin));
  a.write("end", c10::IValue(m.end));
  a.write("numel", c10::IValue(m.numel));
  a.write("step", c10::IValue(m.step));
  a.write("exp_avg", m.exp_avg);
  a.write("exp_avg_sq", m.exp_avg_sq);
  return a;
}

absl::StatusOr<FlatMoments> ReadMomentsFile(const std::string& path) {
  FlatMoments m;
  try {
    torch::serialize::InputArchive a;
    a.load_from(path);
    c10::IValue v;
    a.read("begin", v);
    m.begin = v.toInt();
    a.read("end", v);
    m.end = v.toInt();
    a.read("numel", v);
    m.numel = v.toInt();
    a.read("step", v);
    m.step = v.toInt();
    a.read("exp_avg", m.exp_avg);
    a.read("exp_avg_sq", m.exp_avg_sq);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, " is not a ZeRO moments file: ", e.what()));
  }
  const int64_t length = m.end - m.begin;
  if (m.begin < 0 || length < 0 || m.end > m.numel || m.step < 0 || m.exp_avg.numel() != length ||
      m.exp_avg_sq.numel() != length) {
    return absl::DataLossError(absl::StrCat(path, " describes elements [", m.begin, ", ", m.end, ") of ", m.numel,
                                            " but holds ", m.exp_avg.numel(), " and ", m.exp_avg_sq.numel()));
  }
  m.exp_avg = m.exp_avg.to(torch::kCPU, torch::kFloat).reshape({length});
  m.exp_avg_sq = m.exp_avg_sq.to(torch::kCPU, torch::kFloat).reshape({length});
  return m;
}

absl::StatusOr<FlatMoments> Regather(const std::vector<FlatMoments>& parts, int64_t begin, int64_t end) {
  if (parts.empty()) return absl::FailedPreconditionError("the checkpoint holds no optimizer moments");
  const int64_t numel = parts[0].numel;
  const int64_t step = parts[0].step;
  for (const FlatMoments& p : parts) {
    if (p.numel != numel) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint's optimizer files describe models of ", numel, " and ", p.numel, " parameters"));
    }
    if (p.step != step) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint's optimizer files were written at AdamW steps ", step, " and ", p.step));
    }
  }
  if (begin < 0 || end < begin || end > numel) {
    return absl::FailedPreconditionError(absl::StrCat("elements [", begin, ", ", end, ") are outside the ", numel,
                                                      " parameters the checkpoint's optimizer files describe"));
  }
  FlatMoments out = ZeroMoments(begin, end, numel, step);
  int64_t covered = 0;
  for (const FlatMoments& p : parts) {
    int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    if (lo >= hi) continue;
    out.exp_avg.narrow(0, lo - begin, hi - lo).copy_(p.exp_avg.narrow(0, lo - p.begin, hi - lo));
    out.exp_avg_sq.narrow(0, lo - begin, hi - lo).copy_(p.exp_avg_sq.narrow(0, lo - p.begin, hi - lo));
    covered += hi - lo;
  }
  if (covered != end - begin) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint's optimizer files cover ", covered,
                                                      " of elements [", begin, ", ", end, "): a file is missing"));
  }
  return out;
}

FlatMoments MomentsOfAdamW(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& params) {
  const int64_t numel = TotalElements(params);
  FlatMoments m = ZeroMoments(0, numel, numel, 0);
  int64_t offset = 0;
  for (const torch::Tensor& p : params) {
    if (const torch::optim::AdamWParamState* s = StateOf(optimizer, p)) {
      m.step = std::max<int64_t>(m.step, s->step());
      m.exp_avg.narrow(0, offset, p.numel()).copy_(s->exp_avg().reshape({-1}));
      m.exp_avg_sq.narrow(0, offset, p.numel()).copy_(s->exp_avg_sq().reshape({-1}));
    }
    offset += p.numel();
  }
  return m;
}

int64_t AdamWStateBytes(torch::optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    for (const torch::Tensor& t : {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()}) {
      if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

absl::Status SetAdamWMoments(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& params,
                             const FlatMoments& all) {
  const int64_t numel = TotalElements(params);
  if (all.begin != 0 || all.end != numel || all.numel != numel) {
    return absl::FailedPreconditionError(absl::StrCat("the optimizer moments cover elements [", all.begin, ", ",
                                                      all.end, ") of ", all.numel, "; this model has ", numel));
  }
  if (all.step == 0) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const torch::Tensor& p : params) {
    SetState(optimizer, p, all.step, all.exp_avg.narrow(0, offset, p.numel()),
             all.exp_avg_sq.narrow(0, offset, p.numel()));
    offset += p.numel();
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::AdamW> MakeAdamW(const std::vector<torch::Tensor>& params, const AdamWSettings& s) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  return AdamWOver(std::move(decay), std::move(no_decay), s, /*keep_empty_groups=*/true);
}

namespace {

// One AdamW step's tensors, of parameters about to take the same step (whose bias corrections are
// the same), in groups of at most kStepGroupElements elements: the temporaries of a _foreach group
// (the denominators) stay that small. The fused kernel makes no temporaries, so its group is whole.
struct StepGroup {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  int64_t elements = 0;
};
constexpr int64_t kStepGroupElements = int64_t{1} << 24;

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
constexpr bool kHasFusedAdamW = true;
// The same step in one fused CUDA kernel per group (ATen's, which torch.optim.AdamW(fused=True)
// calls): one pass that reads each parameter, gradient and moment once, where the _foreach
// sequence makes nine passes over the parameters' size. Its step counts are float tensors on the
// device; every parameter of the group shares one, read only.
void FusedStepGroupOf(const StepGroup& g, int64_t step, const torch::optim::AdamWOptions& o) {
  torch::Tensor count = torch::full({}, static_cast<double>(step), g.params[0].options().dtype(torch::kFloat));
  std::vector<torch::Tensor> steps(g.params.size(), count);
  at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                    std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false,
                    /*maximize=*/false);
}
#else
constexpr bool kHasFusedAdamW = false;  // LibTorch 1.13 (Debian's) has no fused AdamW
void FusedStepGroupOf(const StepGroup&, int64_t, const torch::optim::AdamWOptions&) {}
#endif

// Whether `p` steps in the fused kernel.
bool SteppedFused(const torch::Tensor& p) { return kHasFusedAdamW && p.is_cuda(); }

void StepGroupOf(const StepGroup& g, int64_t step, const torch::optim::AdamWOptions& o) {
  if (SteppedFused(g.params[0])) return FusedStepGroupOf(g, step, o);
  const double lr = o.lr(), beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  if (o.weight_decay() != 0) at::_foreach_mul_(g.params, 1 - lr * o.weight_decay());
  at::_foreach_mul_(g.exp_avgs, beta1);
  at::_foreach_add_(g.exp_avgs, g.grads, 1 - beta1);
  at::_foreach_mul_(g.exp_avg_sqs, beta2);
  at::_foreach_addcmul_(g.exp_avg_sqs, g.grads, g.grads, 1 - beta2);
  std::vector<torch::Tensor> denom = at::_foreach_sqrt(g.exp_avg_sqs);
  at::_foreach_div_(denom, std::sqrt(bias_correction2));
  at::_foreach_add_(denom, o.eps());
  at::_foreach_addcdiv_(g.params, g.exp_avgs, denom, -lr / bias_correction1);
}

}  // namespace

void StepAdamW(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "StepAdamW does not offer amsgrad");
    std::map<int64_t, std::vector<StepGroup>> by_step;
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = optimizer.state()[StateKey<AdamWStateMap>(p)];
      if (!slot) {  // the first step: zero moments, as AdamW makes them
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      std::vector<StepGroup>& groups = by_step[state.step()];
      const int64_t limit = SteppedFused(p) ? std::numeric_limits<int64_t>::max() : kStepGroupElements;
      if (groups.empty() || groups.back().elements + p.numel() > limit) groups.emplace_back();
      StepGroup& g = groups.back();
      g.params.push_back(p);
      g.grads.push_back(p.grad());
      g.exp_avgs.push_back(state.exp_avg());
      g.exp_avg_sqs.push_back(state.exp_avg_sq());
      g.elements += p.numel();
    }
    for (const auto& [step, groups] : by_step) {
      for (const StepGroup& g : groups) StepGroupOf(g, step, options);
    }
  }
}

torch::Tensor ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return torch::zeros({});
  std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
  torch::Tensor coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  at::_foreach_mul_(grads, coef);
#else
  for (torch::Tensor& g : grads) g.mul_(coef);  // 1.13 has no _foreach_mul_ by a tensor
#endif
  return total;
}

ZeroAdamW::ZeroAdamW(std::vector<torch::Tensor> params, int rank, int world, const AdamWSettings& settings,
                     int64_t share_bucket_elements)
    : params_(std::move(params)), rank_(rank), world_(world) {
  numel_ = TotalElements(params_);
  chunk_ = (numel_ + world_ - 1) / world_;
  std::tie(begin_, end_) = ZeroRange(numel_, rank_, world_);
  mine_ = SegmentsOf(begin_, end_);
  // The pieces are views of the parameters' storage (detached: AdamW steps them under no_grad,
  // as it steps parameters), so stepping a piece steps the parameter.
  std::vector<torch::Tensor> decay, no_decay;
  for (const Segment& s : mine_) {
    torch::Tensor piece = params_[s.param].detach().view({-1}).narrow(0, s.offset, s.length);
    pieces_.push_back(piece);
    (params_[s.param].dim() >= 2 ? decay : no_decay).push_back(piece);
  }
  adamw_ = AdamWOver(std::move(decay), std::move(no_decay), settings, /*keep_empty_groups=*/false);
  // The all-gather goes bucket by bucket: its buffers cost (world + 1) buckets, not another copy of
  // the parameters (which would undo what partitioning the moments saves).
  bucket_ = std::max<int64_t>(1, std::min(chunk_, share_bucket_elements));
  torch::TensorOptions like = params_.empty() ? torch::TensorOptions(torch::kFloat) : params_[0].options();
  for (int r = 0; r < world_; ++r) gathered_.push_back(torch::zeros({bucket_}, like));
  send_ = torch::zeros({bucket_}, like);
}

std::vector<ZeroAdamW::Segment> ZeroAdamW::SegmentsOf(int64_t begin, int64_t end) const {
  std::vector<Segment> out;
  int64_t start = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].numel();
    int64_t lo = std::max(begin, start), hi = std::min(end, start + n);
    if (lo < hi) out.push_back(Segment{i, lo - start, hi - lo, lo});
    start += n;
  }
  return out;
}

void ZeroAdamW::Step(double lr) {
  ++step_;
  if (!adamw_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < mine_.size(); ++i) {
    const torch::Tensor& grad = params_[mine_[i].param].grad();
    // A parameter without a gradient is skipped, as the unpartitioned AdamW skips it.
    pieces_[i].mutable_grad() =
        grad.defined() ? grad.reshape({-1}).narrow(0, mine_[i].offset, mine_[i].length) : torch::Tensor();
  }
  for (auto& group : adamw_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  StepAdamW(*adamw_);
  for (torch::Tensor& piece : pieces_) piece.mutable_grad() = torch::Tensor();  // the gradients are the model's
}

void ZeroAdamW::ShareParameters(CommGroup& group) {
  if (world_ == 1) return;
  torch::NoGradGuard no_grad;
  auto flat_part = [&](const Segment& s) { return params_[s.param].detach().view({-1}).narrow(0, s.offset, s.length); };
  // Every rank's range has chunk_ elements (the last ones padded), so every rank makes the same
  // all-gathers, one per bucket of it.
  for (int64_t at = 0; at < chunk_; at += bucket_) {
    for (const Segment& s : SegmentsOf(begin_ + at, std::min(end_, begin_ + at + bucket_))) {
      send_.narrow(0, s.flat - begin_ - at, s.length).copy_(flat_part(s));
    }
    std::vector<std::vector<torch::Tensor>> outputs = {gathered_};
    std::vector<torch::Tensor> inputs = {send_};
    uint64_t sequence = CollectiveRing::Process().Begin("all-gather", bucket_ * send_.element_size() * world_);
    group.allgather(outputs, inputs)->wait();
    CollectiveRing::Process().End(sequence);
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      auto [b, e] = ZeroRange(numel_, r, world_);
      for (const Segment& s : SegmentsOf(b + at, std::min(e, b + at + bucket_))) {
        flat_part(s).copy_(gathered_[r].narrow(0, s.flat - b - at, s.length));
      }
    }
  }
}

std::vector<ZeroAdamW::MomentPart> ZeroAdamW::MomentParts() const {
  std::vector<MomentPart> parts;
  if (!adamw_) return parts;
  for (size_t i = 0; i < mine_.size(); ++i) {
    if (const torch::optim::AdamWParamState* s = StateOf(*adamw_, pieces_[i])) {
      parts.push_back({s->exp_avg(), s->exp_avg_sq(), mine_[i].flat - begin_});
    }
  }
  return parts;
}

FlatMoments ZeroAdamW::Moments() const {
  FlatMoments m = ZeroMoments(begin_, end_, numel_, step_);
  for (const MomentPart& part : MomentParts()) {
    m.exp_avg.narrow(0, part.at, part.exp_avg.numel()).copy_(part.exp_avg.reshape({-1}));
    m.exp_avg_sq.narrow(0, part.at, part.exp_avg_sq.numel()).copy_(part.exp_avg_sq.reshape({-1}));
  }
  return m;
}

absl::Status ZeroAdamW::LoadMoments(const FlatMoments& mine) {
  if (mine.begin != begin_ || mine.end != end_ || mine.numel != numel_) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, " of ", world_, " keeps elements [", begin_, ", ",
                                                      end_, ") of ", numel_, ", not [", mine.begin, ", ", mine.end,
                                                      ") of ", mine.numel));
  }
  step_ = mine.step;
  if (mine.step == 0 || !adamw_) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < mine_.size(); ++i) {
    SetState(*adamw_, pieces_[i], mine.step, mine.exp_avg.narrow(0, mine_[i].flat - begin_, mine_[i].length),
             mine.exp_avg_sq.narrow(0, mine_[i].flat - begin_, mine_[i].length));
  }
  return absl::OkStatus();
}

std::string ZeroAdamW::LayoutJson() const {
  nlohmann::json ranges = nlohmann::json::array();
  for (int r = 0; r < world_; ++r) {
    auto [b, e] = ZeroRange(numel_, r, world_);
    ranges.push_back({b, e});
  }
  nlohmann::json doc = {{"zero", 1}, {"world_size", world_}, {"numel", numel_}, {"ranges", ranges}};
  return doc.dump();
}

}  // namespace dt
