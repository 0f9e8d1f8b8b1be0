#include "trainer/gpt2_model.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dt {

absl::StatusOr<Gpt2Config> MakeGpt2Config(const std::string& model, const std::string& overrides) {
  Gpt2Config c;
  if (model == "gpt2") {
    // The defaults: 124M.
  } else if (model == "gpt2-medium") {
    c.n_embd = 1024;
    c.n_layer = 24;
    c.n_head = 16;
  } else if (model == "tiny") {
    c.n_embd = 64;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_positions = 256;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--model \"", model, "\" is not one of gpt2, gpt2-medium, tiny"));
  }
  for (absl::string_view part : absl::StrSplit(overrides, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    int64_t value = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &value) || value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config-overrides: \"", part, "\" is not name=positive-integer (e.g. n_embd=128,n_layer=4)"));
    }
    if (kv[0] == "n_embd") {
      c.n_embd = value;
    } else if (kv[0] == "n_layer") {
      c.n_layer = value;
    } else if (kv[0] == "n_head") {
      c.n_head = value;
    } else if (kv[0] == "n_positions") {
      c.n_positions = value;
    } else if (kv[0] == "vocab_size") {
      c.vocab_size = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--config-overrides: unknown \"", kv[0],
                                                     "\" (known: n_embd, n_layer, n_head, n_positions, vocab_size)"));
    }
  }
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("n_embd ", c.n_embd, " is not divisible by n_head ", c.n_head));
  }
  return c;
}

namespace {

// ATen's linear, not the C++ frontend's Linear::forward. For 3-D input that one multiplies, then
// adds the bias in a kernel of its own (under bf16 autocast, a casting kernel adding the fp32
// bias to the bf16 product): 48 extra kernels a step in GPT-2 small, 3 ms of an 83 ms step on an
// H200. ATen's folds the bias into the matrix product, as Python's F.linear does.
torch::Tensor Apply(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const Gpt2Config& c) : n_head_(c.n_head), n_embd_(c.n_embd) {
  c_attn = register_module("c_attn", torch::nn::Linear(c.n_embd, 3 * c.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(c.n_embd, c.n_embd));
  attn_drop_ = register_module("attn_drop", torch::nn::Dropout(c.dropout));
  resid_drop_ = register_module("resid_drop", torch::nn::Dropout(c.dropout));
  mask_ = register_buffer(
      "mask", torch::ones({c.n_positions, c.n_positions}).tril().view({1, 1, c.n_positions, c.n_positions}));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head_;
  std::vector<torch::Tensor> qkv = Apply(c_attn, x).split(n_embd_, 2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, hd}).transpose(1, 2); };
  torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  att = att.masked_fill(mask_.index({torch::indexing::Slice(), torch::indexing::Slice(), torch::indexing::Slice(0, T),
                                     torch::indexing::Slice(0, T)}) == 0,
                        -std::numeric_limits<float>::infinity());
  // Under bf16 autocast the scores are bf16: the softmax runs in fp32 (as CUDA's autocast does) and
  // the product with v casts it back.
  att = attn_drop_->forward(torch::softmax(att.scalar_type() == torch::kFloat ? att : att.to(torch::kFloat), -1));
  torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  return resid_drop_->forward(Apply(c_proj, y));
}

BlockImpl::BlockImpl(const Gpt2Config& c) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  c_fc = register_module("c_fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
  mlp_proj = register_module("mlp_proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
  mlp_drop = register_module("mlp_drop", torch::nn::Dropout(c.dropout));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn->forward(ln_1->forward(x));
  // GPT-2's GELU is the tanh approximation.
  return x + mlp_drop->forward(Apply(mlp_proj, torch::gelu(Apply(c_fc, ln_2->forward(x)), "tanh")));
}

Gpt2Impl::Gpt2Impl(const Gpt2Config& c) : config_(c) {
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.n_positions, c.n_embd));
  drop_ = register_module("drop", torch::nn::Dropout(c.dropout));
  blocks_ = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_->push_back(Block(c));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));

  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto* linear = item.value()->as<torch::nn::Linear>()) {
      // Projections into the residual stream: scaled so the stream's variance does not grow with depth.
      bool residual = absl::EndsWith(item.key(), "c_proj") || absl::EndsWith(item.key(), "mlp_proj");
      linear->weight.normal_(0.0, residual ? residual_std : 0.02);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* emb = item.value()->as<torch::nn::Embedding>()) {
      emb->weight.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor Gpt2Impl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.n_positions, "sequence length ", T, " exceeds n_positions ", config_.n_positions);
  torch::Tensor pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  torch::Tensor x = drop_->forward(wte_->forward(idx) + wpe_->forward(pos));
  for (const auto& block : *blocks_) x = block->as<Block>()->forward(x);
  x = ln_f_->forward(x);
  // The language-model head shares the token embedding's weight.
  return torch::matmul(x, wte_->weight.t());
}

torch::Tensor Gpt2Impl::Loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  torch::Tensor logits = forward(idx);
  // bf16 logits (autocast) are scored in fp32.
  if (logits.scalar_type() != torch::kFloat) logits = logits.to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

int64_t Gpt2Impl::NumParameters() {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace dt
