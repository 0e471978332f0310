#pragma once
/// BigGAN building blocks (Brock et al. 2019, "Large Scale GAN Training for High Fidelity
/// Natural Image Synthesis"), laid out as BigGAN-PyTorch's layers.py: spectrally normalized
/// conv/linear/embedding (Miyato et al. 2018), class-conditional BatchNorm over the global
/// batch, the SAGAN self-attention block (Zhang et al. 2019), and the residual G and D
/// blocks.
///
/// Common to every module here:
///  - Tensors live on the CPU. Activations are float32, float64 or bfloat16; every forward
///    and backward runs in all three (tests/test_biggan_layers.cpp runs each dtype).
///  - Parameters are created uninitialized (torch::empty) apart from BatchNorm gains (1),
///    biases (0) and the attention gain (0); init_weights() gives them BigGAN-PyTorch's
///    initialization. Spectral-norm vectors `u` are always drawn from torch's global
///    generator at construction (randn, as BigGAN-PyTorch's SN).
///  - Buffers (`u`, running statistics) stay in the dtype the module was built or cast in
///    (the master dtype, float32 or float64) while mixed precision casts the parameters to
///    bfloat16; the modules accept that mix.
#include <cstdint>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/nn/sync_batchnorm.h"

namespace shardgan::biggan {

/// Spectral-norm epsilon (BigGAN-PyTorch's SN_eps as its training scripts set it).
constexpr double kSnEps = 1e-8;
/// BatchNorm epsilon and running-statistics momentum (BigGAN-PyTorch's BN_eps, 0.1).
constexpr double kBnEps = 1e-5;
constexpr double kBnMomentum = 0.1;

/// One power iteration of spectral normalization (Miyato et al. 2018, Alg. 1; BigGAN-PyTorch
/// `power_iteration` with num_svs = 1). With W the weight viewed as [out, in] (rows = dim 0,
/// so an embedding [n, d] has out = n):
///   v = normalize(u W), u' = normalize(v W^T)  (no grad, in u's dtype; W converted to it)
///   sigma = v W^T u'^T                          (float32 or W's dtype if wider; differentiable in W
///                                                with u' and v constant: dsigma/dW = u'^T v, in W's dtype)
/// normalize(x) = x / max(||x||, eps). When `update`, u' is written into `u` in place.
/// `u`: [1, out], float32 or float64. Returns {W / sigma (W's shape and dtype), sigma (0-dim,
/// float32, or float64 for a float64 W)}. Local.
std::pair<at::Tensor, at::Tensor> spectral_normalize(const at::Tensor& weight, at::Tensor& u,
                                                     bool update, double eps = kSnEps);

/// Base of the SN layers: parameter "weight", buffer "u" [1, weight.size(0)] (randn).
/// One power iteration per training-mode forward updates u; eval mode, and a forward under
/// a PowerIterationPause (shardgan/nn/power_iteration.h), leave it.
///
/// The layers compute op(x, W) / sigma (+ bias) rather than op(x, W / sigma): the ops are
/// linear in W, so the result is the same, but autograd then saves W itself, a view of the
/// sharding unit's gathered flat parameter, instead of a full-size W / sigma copy per layer
/// that would stay alive from forward to backward and defeat ZeRO-3 (at 1e9 parameters
/// those copies were 3 GiB per rank in the D step).
class SNBase : public torch::nn::Module {
 public:
  at::Tensor weight, u;
  /// sigma of the last forward (detached, 0-dim, float32 or float64); undefined before.
  const at::Tensor& last_sigma() const { return last_sigma_; }
  /// How many times u was advanced (training-mode forwards outside a pause). Local.
  int64_t advances() const { return advances_; }

 protected:
  /// sigma (differentiable in W), updating u in training mode; remembers it. `w_float`, if
  /// given, receives W in u's dtype (W's shape; W itself when the dtypes agree).
  at::Tensor sigma(at::Tensor* w_float = nullptr);
  at::Tensor last_sigma_;
  int64_t advances_ = 0;
};

/// Conv2d with spectral norm (BigGAN-PyTorch SNConv2d): stride 1, "weight"
/// [out, in, k, k], optional "bias" [out]. x [B, in, H, W] -> [B, out, H + 2p - k + 1, ...].
/// conv(x, W) / sigma is one autograd function that saves x, W and sigma but not the
/// output, and takes sigma's gradient from the weight gradient (-<W, dW> / sigma, since
/// the conv is linear in W) instead of from activation-sized temporaries.
class SNConv2dImpl : public SNBase {
 public:
  SNConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t padding, bool bias = true);
  at::Tensor forward(const at::Tensor& x);
  /// forward(upsample2(x)), nearest x2, without the upsampled input: a 3x3 conv (padding
  /// 1) as one transposed conv of x with upsample_conv_kernel(W) (stride 2, padding 1), a
  /// 1x1 conv (padding 0) at x's resolution and then upsampled (the two commute). The same
  /// function and gradients with a different rounding; a 3x3 takes 4/9 of the
  /// multiply-adds. x [B, in, H, W] -> [B, out, 2H, 2W], x's dtype. One power iteration,
  /// as forward. Throws c10::Error for any other kernel and padding. Local.
  at::Tensor forward_upsampled(const at::Tensor& x);
  at::Tensor bias;

 private:
  int64_t padding_;
};
TORCH_MODULE(SNConv2d);

/// Nearest x2 upsampling followed by a 3x3 convolution with padding 1, as one transposed
/// convolution of the low-resolution input (stride 2, padding 1, a 4x4 kernel; the
/// "resize-convolution" of Odena et al. 2016, "Deconvolution and Checkerboard Artifacts",
/// written as the sub-pixel convolution of Shi et al. 2016, arXiv:1609.07009). Along each
/// spatial axis, output 2i reads input rows i - 1 (with w_0) and i (with w_1 + w_2), and
/// output 2i + 1 reads rows i (w_0 + w_1) and i + 1 (w_2), so the kernel is
/// [w_2, w_1 + w_2, w_0 + w_1, w_0] along each axis. w [out, in, 3, 3] -> [in, out, 4, 4],
/// w's dtype and device, differentiable in w. Throws c10::Error for any other shape. Local.
at::Tensor upsample_conv_kernel(const at::Tensor& w);

/// Linear with spectral norm: "weight" [out, in], optional "bias" [out]. x [B, in] -> [B, out].
class SNLinearImpl : public SNBase {
 public:
  SNLinearImpl(int64_t in, int64_t out, bool bias = true);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor bias;
};
TORCH_MODULE(SNLinear);

/// Embedding with spectral norm on "weight" [n, dim] (u is [1, n], as BigGAN-PyTorch's
/// SNEmbedding). y int64 [B] in [0, n) -> [B, dim] in the weight's dtype.
class SNEmbeddingImpl : public SNBase {
 public:
  SNEmbeddingImpl(int64_t n, int64_t dim);
  at::Tensor forward(const at::Tensor& y);
};
TORCH_MODULE(SNEmbedding);

/// Class-conditional BatchNorm (BigGAN-PyTorch `ccbn` with G_shared): non-affine
/// normalization with the statistics of the GLOBAL batch (sync_batch_norm), then
/// out = xhat * (1 + gain(cond)) + bias(cond), gain and bias bias-free SNLinears
/// cond_dim -> C. Buffers "running_mean" (0), "running_var" (1).
/// forward(x [B, C, H, W], cond [B, cond_dim]) -> [B, C, H, W], x's dtype. Collective in
/// training mode (see sync_batch_norm).
class CCBNImpl : public torch::nn::Module {
 public:
  CCBNImpl(int64_t channels, int64_t cond_dim, Communicator* comm);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cond);
  /// The conditional scale and shift of forward: (1 + gain(cond), bias(cond)), each
  /// [B, C, 1, 1] in cond's dtype. Local.
  std::pair<at::Tensor, at::Tensor> scale_shift(const at::Tensor& cond);
  /// forward with the scale and shift given: xhat(x) * scale + shift. Collective in
  /// training mode, as forward.
  at::Tensor apply(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift);
  SNLinear gain{nullptr}, bias{nullptr};
  at::Tensor running_mean, running_var;

 private:
  Communicator* comm_;
};
TORCH_MODULE(CCBN);

/// SAGAN non-local block (Zhang et al. 2019; BigGAN-PyTorch `Attention`): theta, phi
/// (ch/8), g (ch/2) and o (ch) are bias-free 1x1 SN convs; phi and g are max-pooled 2x2;
/// beta = softmax over the pooled positions of theta^T phi; out = x + gamma * o(g beta^T),
/// with g beta^T computed as (beta g^T)^T (the same products; softmax's backward then gets a
/// contiguous gradient and copies nothing). "gamma" [1] starts at 0, so a fresh block is the
/// identity. x [B, ch, H, W] (ch >= 8, H and W even) -> same shape and dtype.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(int64_t ch);
  at::Tensor forward(const at::Tensor& x);
  SNConv2d theta{nullptr}, phi{nullptr}, g{nullptr}, o{nullptr};
  at::Tensor gamma;

 private:
  int64_t ch_;
};
TORCH_MODULE(Attention);

/// Residual up-block of G (BigGAN-PyTorch GBlock): h = conv2(relu(bn2(conv1(up(relu(bn1(x,
/// cond)))), cond))), shortcut = conv_sc(up(x)) (1x1 SN conv, present when in != out or
/// upsampling), out = h + shortcut. up = nearest x2 when `upsample`. Convs 3x3, padding 1.
/// forward(x [B, in, H, W], cond [B, cond_dim]) -> [B, out, 2H or H, 2W or W]. Collective
/// in training mode (two SyncBatchNorms). Checkpoint segments (checkpoint_segment): the
/// residual path up to conv1, the rest of it, and the shortcut; the four conditional
/// scales and shifts are computed before them, in the unit's own graph.
/// `fused_upsample` (model.fused_upsample): conv1 and conv_sc compute on the
/// low-resolution input through SNConv2d::forward_upsampled, so the upsampled activations
/// (4x the block's input) are never made; the same function, rounded differently.
class GBlockImpl : public torch::nn::Module {
 public:
  GBlockImpl(int64_t in, int64_t out, int64_t cond_dim, bool upsample, Communicator* comm,
             bool fused_upsample = false);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cond);
  SNConv2d conv1{nullptr}, conv2{nullptr}, conv_sc{nullptr};
  CCBN bn1{nullptr}, bn2{nullptr};

 private:
  /// conv(up(x)) when upsampling, else conv(x); fused as fused_upsample says.
  at::Tensor conv_up(SNConv2d& conv, const at::Tensor& x);
  bool upsample_, fused_;
};
TORCH_MODULE(GBlock);

/// Residual down-block of D (BigGAN-PyTorch DBlock, wide): h = conv2(relu(conv1(a(x)))),
/// then avg-pool 2 when `downsample`; a = relu when `preactivation` (every block but D's
/// first), else identity. Shortcut: preactivation: pool(conv_sc(x)); otherwise
/// conv_sc(pool(x)); conv_sc (1x1) present when in != out or downsampling.
/// x [B, in, H, W] -> [B, out, H/2 or H, W/2 or W]. Local. Checkpoint segment
/// (checkpoint_segment): the residual path.
class DBlockImpl : public torch::nn::Module {
 public:
  DBlockImpl(int64_t in, int64_t out, bool preactivation, bool downsample);
  at::Tensor forward(const at::Tensor& x);
  SNConv2d conv1{nullptr}, conv2{nullptr}, conv_sc{nullptr};

 private:
  bool preactivation_, downsample_;
};
TORCH_MODULE(DBlock);

/// G's output layer (BigGAN-PyTorch output_layer + tanh): affine SyncBatchNorm over the
/// global batch ("bn": weight 1, bias 0, running stats) -> relu -> SNConv2d 3x3 (with bias)
/// to `channels` -> tanh. x [B, ch, H, W] -> [B, channels, H, W] in [-1, 1], x's dtype.
/// Collective in training mode.
class GOutImpl : public torch::nn::Module {
 public:
  GOutImpl(int64_t ch, int64_t channels, Communicator* comm);
  at::Tensor forward(const at::Tensor& x);
  SyncBatchNorm2d bn{nullptr};
  SNConv2d conv{nullptr};

 private:
  Communicator* comm_;
};
TORCH_MODULE(GOut);

/// D's output layer with projection (Miyato & Koyama 2018; BigGAN-PyTorch D.forward):
/// h = sum_{H,W} relu(x); logits = linear(h) + sum(embed(y) * h, dim 1), linear an
/// SNLinear ch -> 1 with bias, embed an SNEmbedding n_classes -> ch.
/// forward(x [B, ch, H, W], y int64 [B]) -> {logits [B]}, x's dtype. Local.
/// With `class_head`, also AC-GAN's auxiliary classifier (Odena et al. 2017): `classes`,
/// an SNLinear ch -> n_classes with bias on the same h, and forward returns {logits [B],
/// class logits [B, n_classes]}.
class DOutImpl : public torch::nn::Module {
 public:
  DOutImpl(int64_t ch, int64_t n_classes, bool class_head = false);
  std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& y);
  SNLinear linear{nullptr};
  SNEmbedding embed{nullptr};
  SNLinear classes{nullptr};  ///< null without the class head
};
TORCH_MODULE(DOut);

/// Weight initialization schemes of BigGAN-PyTorch (G_init / D_init).
enum class Init { kOrtho, kN02, kXavier };

/// BigGAN-PyTorch init_weights over every SN conv, linear and embedding inside `m` (in
/// modules() order, drawing from torch's global generator): weights orthogonal
/// (torch::nn::init::orthogonal_ on the weight viewed as [rows, numel / rows]), N(0, 0.02)
/// or Xavier-uniform; biases as PyTorch's default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
/// BatchNorm gains/biases and attention gains keep their constructed 1 / 0 / 0. Local.
void init_weights(torch::nn::Module& m, Init scheme);

}  // namespace shardgan::biggan
