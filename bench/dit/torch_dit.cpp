// The DiT sampler step in libtorch, with retrace's weights (see torch_dit.hpp).
#include "torch_dit.hpp"

#include <torch/torch.h>

#include <cmath>
#include <map>

namespace retrace::bench {

namespace {

class LibtorchStep final : public TorchStep {
 public:
  explicit LibtorchStep(const models::DiT& model)
      : config_(model.config()), tokens_(model.config().tokens()) {
    for (const auto& [name, shape] : models::DiT::weight_shapes(config_)) {
      std::vector<float> values = model.weight(name).to_vector<float>();
      std::vector<std::int64_t> dims(shape.dims().begin(), shape.dims().end());
      weights_[name] = torch::from_blob(values.data(), dims, torch::kFloat32).clone();
    }
  }

  void set_threads(int threads) override { torch::set_num_threads(threads); }

  void step(float* x_data, const float* t_data, std::int64_t label, float a, float b) override {
    torch::NoGradGuard no_grad;
    const models::DiTConfig& c = config_;
    const std::int64_t h = c.hidden, p = c.patch_size, g = c.grid();
    torch::Tensor x = torch::from_blob(x_data, {1, c.in_channels, c.input_size, c.input_size},
                                       torch::kFloat32);
    const torch::Tensor t =
        torch::from_blob(const_cast<float*>(t_data), {1, c.frequency_size}, torch::kFloat32);
    // The reference's PatchEmbed: a convolution with stride = kernel = patch.
    torch::Tensor y = torch::conv2d(x, weights_.at("x_embedder.proj.weight"),
                                    weights_.at("x_embedder.proj.bias"), {p, p});
    y = y.flatten(2).transpose(1, 2) + weights_.at("pos_embed");
    torch::Tensor temb = linear(t, "t_embedder.mlp.0");
    temb = linear(torch::silu(temb), "t_embedder.mlp.2");
    const torch::Tensor c_emb =
        temb + weights_.at("y_embedder.embedding_table.weight").index({torch::tensor({label})});
    const torch::Tensor cond = torch::silu(c_emb).unsqueeze(1);
    for (std::int64_t blk = 0; blk < c.depth; ++blk) y = block(y, cond, blk);
    const auto mod = linear(cond, "final_layer.adaLN_modulation.1").chunk(2, -1);
    y = modulate(torch::layer_norm(y, {h}, {}, {}, 1e-6), mod[0], mod[1]);
    y = linear(y, "final_layer.linear");
    // Unpatchify: [1, g, g, p, p, C_out] -> [1, C_out, H, W].
    y = y.reshape({1, g, g, p, p, c.out_channels()}).permute({0, 5, 1, 3, 2, 4});
    y = y.reshape({1, c.out_channels(), c.input_size, c.input_size});
    const torch::Tensor eps = y.slice(1, 0, c.in_channels);
    x.copy_(x * a + eps * b);  // writes into x_data
  }

 private:
  torch::Tensor linear(const torch::Tensor& x, const std::string& prefix) {
    return torch::nn::functional::linear(x, weights_.at(prefix + ".weight"),
                                         weights_.at(prefix + ".bias"));
  }
  static torch::Tensor modulate(const torch::Tensor& x, const torch::Tensor& shift,
                                const torch::Tensor& scale) {
    return x * (scale + 1) + shift;
  }
  torch::Tensor block(const torch::Tensor& x, const torch::Tensor& c, std::int64_t b) {
    const std::int64_t h = config_.hidden, heads = config_.heads, d = h / heads;
    const std::string p = "blocks." + std::to_string(b) + ".";
    const auto mod = linear(c, p + "adaLN_modulation.1").chunk(6, -1);
    torch::Tensor y = modulate(torch::layer_norm(x, {h}, {}, {}, 1e-6), mod[0], mod[1]);
    const torch::Tensor qkv =
        linear(y, p + "attn.qkv").reshape({1, tokens_, 3, heads, d}).permute({2, 0, 3, 1, 4});
    const torch::Tensor scores =
        torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    torch::Tensor attn = torch::matmul(torch::softmax(scores, -1), qkv[2]);
    attn = linear(attn.permute({0, 2, 1, 3}).reshape({1, tokens_, h}), p + "attn.proj");
    torch::Tensor out = x + mod[2] * attn;
    y = modulate(torch::layer_norm(out, {h}, {}, {}, 1e-6), mod[3], mod[4]);
    y = linear(torch::gelu(linear(y, p + "mlp.fc1"), "tanh"), p + "mlp.fc2");
    return out + mod[5] * y;
  }

  models::DiTConfig config_;
  std::int64_t tokens_;
  std::map<std::string, torch::Tensor> weights_;
};

}  // namespace

std::unique_ptr<TorchStep> make_torch_step(const models::DiT& model, std::string&) {
  return std::make_unique<LibtorchStep>(model);
}

}  // namespace retrace::bench
