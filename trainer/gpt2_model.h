// GPT-2 in LibTorch: token + position embeddings, pre-LayerNorm transformer blocks with causal
// self-attention and a GELU MLP, a final LayerNorm, and a language-model head tied to the token
// embedding. GPT-2 initialisation (N(0, 0.02), residual projections scaled by 1/sqrt(2·n_layer)).
#pragma once

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"

namespace dt {

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double dropout = 0.0;
};

// "gpt2" (124M), "gpt2-medium" (350M), "tiny" (tests); `overrides` like
// "n_embd=128,n_layer=4,n_head=4,n_positions=256". INVALID_ARGUMENT names the bad part.
absl::StatusOr<Gpt2Config> MakeGpt2Config(const std::string& model, const std::string& overrides);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const Gpt2Config& c);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t n_head_, n_embd_;
  torch::nn::Dropout attn_drop_{nullptr}, resid_drop_{nullptr};
  torch::Tensor mask_;
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Gpt2Config& c);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear c_fc{nullptr}, mlp_proj{nullptr};
  torch::nn::Dropout mlp_drop{nullptr};
};
TORCH_MODULE(Block);

class Gpt2Impl : public torch::nn::Module {
 public:
  explicit Gpt2Impl(const Gpt2Config& c);
  // Logits [B, T, vocab] for token ids [B, T].
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean cross-entropy of next-token prediction.
  torch::Tensor Loss(const torch::Tensor& idx, const torch::Tensor& targets);
  int64_t NumParameters();
  const Gpt2Config& config() const { return config_; }

 private:
  Gpt2Config config_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::Dropout drop_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt2);

}  // namespace dt
