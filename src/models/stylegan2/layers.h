#pragma once
/// StyleGAN2 building blocks (Karras et al. 2020, "Analyzing and Improving the Image Quality of
/// StyleGAN", arXiv:1912.04958), laid out as our plain-PyTorch peer benchmarks/peers/stylegan2.py
/// (same parameter names, shapes and order, and the same operations in the same order where
/// that costs nothing), which was written from /work/notes/stylegan2_facts.md.
///
/// Common to every module here:
///  - Equalized learning rate (Karras et al. 2018, Sec. 4.1): weights are stored N(0, 1)
///    (divided by the learning-rate multiplier lr_mul) and scaled at run time by
///    lr_mul / sqrt(fan_in); biases are stored as they are and scaled by lr_mul.
///  - Parameters are created uninitialized (torch::empty); initialize() gives them the
///    authors' initialization, drawn from torch's global generator (which
///    build_sharded_model seeds per unit). Without it a module serves for counting only.
///  - Tensors are float32, float64 or bfloat16, on any device; every forward is built from
///    plain autograd operations, so it is differentiable twice (R1 and path-length
///    regularization differentiate a gradient).
///  - "lrelu" is leaky ReLU with slope 0.2 times sqrt(2) (the gain that keeps the
///    second moment); "linear" is the identity.
#include <cstdint>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "shardgan/comm/communicator.h"

namespace shardgan::stylegan2 {

/// Leaky ReLU slope and the gain applied after it (sqrt 2).
constexpr double kLreluSlope = 0.2;
extern const double kLreluGain;

/// x * rsqrt(mean(x^2 over dim 1) + eps). x [N, D] -> [N, D], x's dtype. Local.
at::Tensor normalize_2nd_moment(const at::Tensor& x, double eps = 1e-8);

/// The [1, 3, 3, 1] resampling filter: outer([1, 3, 3, 1], [1, 3, 3, 1]) / 64, [4, 4] with
/// options `o`.
at::Tensor fir_filter(const at::TensorOptions& o);

/// Depthwise filtering by fir_filter() * gain after zero padding of `pad_lo` before and
/// `pad_hi` after each spatial axis. x [N, C, H, W] -> [N, C, H + pad_lo + pad_hi - 3, ...],
/// x's dtype.
at::Tensor blur(const at::Tensor& x, int64_t pad_lo, int64_t pad_hi, double gain = 1.0);

/// x2 upsampling: zeros inserted after every pixel, then blur(pad 2, 1, gain 4), which keeps
/// the mean. x [N, C, H, W] -> [N, C, 2H, 2W].
at::Tensor upsample2d(const at::Tensor& x);

/// /2 downsampling: blur(pad 1, 1), then every second pixel. x [N, C, H, W] (H, W even) ->
/// [N, C, H/2, W/2].
at::Tensor downsample2d(const at::Tensor& x);

/// Modulated convolution (Karras et al. 2020, Sec. 2.2), the non-fused form: the input is
/// scaled per sample and input channel by `styles`, convolved with the shared `weight`, and,
/// with `demodulate`, each output channel is scaled by
///   d[n, o] = rsqrt(sum_{i,k,l} (weight[o, i, k, l] * styles[n, i])^2 + 1e-8),
/// computed as rsqrt(styles^2 @ sum_{k,l} weight^2 + 1e-8) (the same sum, without the
/// [N, O, I, k, k] per-sample weights that autograd would otherwise keep alive).
/// `up`: a transposed convolution of stride 2 followed by blur(pad 1, 1, gain 4), else a
/// convolution with padding k / 2. x [N, I, H, W], weight [O, I, k, k], styles [N, I] ->
/// [N, O, H, W], or [N, O, 2H, 2W] with `up`. Local.
at::Tensor modulated_conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& styles,
                            bool demodulate, bool up);

/// Minibatch standard deviation (Karras et al. 2018, Sec. 3): groups of G = min(group_size, N)
/// consecutive samples (sample j belongs to group j / G; the authors' code takes j mod (N / G),
/// which changes with the batch per GPU: consecutive groups are the same in any world size
/// whose per-rank batch is a multiple of G), the standard deviation over each group
/// of every feature (+1e-8 inside the square root), averaged over the C / F channels of each
/// of `num_channels` = F channel groups and over the pixels, appended as F constant channels.
/// x [N, C, H, W] -> [N, C + F, H, W]. Throws std::invalid_argument if N is not a multiple
/// of G or C of F.
at::Tensor minibatch_stddev(const at::Tensor& x, int64_t group_size, int64_t num_channels);

/// The seed of noise layer `layer` for a sample whose noise seed is `sample_seed`: a 64-bit
/// mix (splitmix64) of both, so that the noise of one sample does not depend on the batch
/// or the rank it is generated in.
uint64_t noise_seed(int64_t sample_seed, int64_t layer);

/// Per-sample noise images for noise layer `layer`: sample i gets
/// randn([resolution, resolution]) (float64) from a CPU generator seeded with
/// noise_seed(seeds[i], layer). seeds int64 [N] (any device) -> [N, 1, resolution,
/// resolution] with options `o` (dtype and device). Touches no global generator. Local.
at::Tensor draw_noise(const at::Tensor& seeds, int64_t layer, int64_t resolution, const at::TensorOptions& o);

/// Equalized-lr fully connected layer: "weight" [out, in] (init N(0, 1) / lr_mul), "bias"
/// [out] (init bias_init). y = act(x (weight * lr_mul / sqrt(in))^T + bias * lr_mul),
/// act lrelu or linear. x [N, in] -> [N, out].
class FullyConnectedImpl : public torch::nn::Module {
 public:
  FullyConnectedImpl(int64_t in, int64_t out, double lr_mul = 1.0, double bias_init = 0.0, bool lrelu = false);
  at::Tensor forward(const at::Tensor& x);
  /// The authors' initialization of weight and bias (torch's global generator).
  void reset_parameters();
  at::Tensor weight, bias;

 private:
  double lr_mul_, bias_init_, weight_gain_;
  bool lrelu_;
};
TORCH_MODULE(FullyConnected);

/// Equalized-lr convolution (D's layers): "weight" [out, in, k, k] (init N(0, 1)), optional
/// "bias" [out] (init 0), run-time gain 1 / sqrt(in k k). With `down`: blur(pad p, p),
/// p = 1 + (k - 1) / 2, then a stride-2 convolution without padding; else a convolution with
/// padding k / 2. Then bias, act (lrelu or linear), and the result times `gain`.
/// x [N, in, H, W] (H, W even with `down`) -> [N, out, H or H/2, W or W/2].
class Conv2dLayerImpl : public torch::nn::Module {
 public:
  Conv2dLayerImpl(int64_t in, int64_t out, int64_t kernel, bool bias = true, bool lrelu = true, bool down = false);
  at::Tensor forward(const at::Tensor& x, double gain = 1.0);
  void reset_parameters();
  at::Tensor weight, bias;  ///< bias undefined when built without one

 private:
  int64_t kernel_;
  double weight_gain_;
  bool lrelu_, down_;
};
TORCH_MODULE(Conv2dLayer);

/// One modulated 3x3 convolution of G's synthesis network: "weight" [out, in, 3, 3] (init
/// N(0, 1), gain 1 / sqrt(9 in)), "noise_strength" [] (init 0), "bias" [out] (init 0), and
/// "affine", a FullyConnected w_dim -> in with bias_init 1 (the styles start near 1).
/// forward(x [N, in, H, W], w [N, w_dim], noise [N, 1, R, R] or undefined (no noise)) ->
/// lrelu(modulated_conv2d(x, weight * gain, affine(w), demodulated, up) + noise *
/// noise_strength + bias), [N, out, R, R], R = resolution (= 2H with `up`, else H).
class SynthesisLayerImpl : public torch::nn::Module {
 public:
  SynthesisLayerImpl(int64_t in, int64_t out, int64_t w_dim, int64_t resolution, bool up);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& noise);
  /// The layer's own parameters (not the affine's).
  void reset_parameters();
  FullyConnected affine{nullptr};
  at::Tensor weight, noise_strength, bias;

 private:
  int64_t resolution_;
  double weight_gain_;
  bool up_;
};
TORCH_MODULE(SynthesisLayer);

/// G's toRGB: "weight" [channels, in, 1, 1] (init N(0, 1)), "bias" [channels] (init 0),
/// "affine" FullyConnected w_dim -> in (bias_init 1). forward(x [N, in, H, W], w [N, w_dim])
/// -> modulated_conv2d(x, weight, affine(w) / sqrt(in), not demodulated) + bias,
/// [N, channels, H, W], linear.
class ToRGBImpl : public torch::nn::Module {
 public:
  ToRGBImpl(int64_t in, int64_t w_dim, int64_t channels);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w);
  void reset_parameters();
  FullyConnected affine{nullptr};
  at::Tensor weight, bias;

 private:
  double weight_gain_;
};
TORCH_MODULE(ToRGB);

/// One resolution of G's synthesis network ('skip' architecture). in == 0 (4x4): "const"
/// [out, 4, 4] (init N(0, 1)) and conv1; otherwise conv0 (in -> out, up) and conv1
/// (out -> out); then torgb. num_conv() is 1 or 2.
/// forward(x [N, in, R/2, R/2] (undefined at 4x4), img [N, C, R/2, R/2] (undefined at 4x4),
/// ws [N, num_conv() + 1, w_dim], noise: num_conv() tensors [N, 1, R, R] or undefined) ->
/// {x [N, out, R, R], img [N, C, R, R]}: conv j takes ws[:, j], torgb ws[:, num_conv()] (the
/// next block's first w), img = upsample2d(img) + torgb(x).
class SynthesisBlockImpl : public torch::nn::Module {
 public:
  SynthesisBlockImpl(int64_t in, int64_t out, int64_t w_dim, int64_t resolution, int64_t channels);
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& img, const at::Tensor& ws,
                                            const std::vector<at::Tensor>& noise);
  /// "const" (4x4 only).
  void reset_parameters();
  int64_t num_conv() const { return in_ == 0 ? 1 : 2; }
  at::Tensor const_input;  ///< registered as "const"; undefined above 4x4
  SynthesisLayer conv0{nullptr}, conv1{nullptr};
  ToRGB torgb{nullptr};

 private:
  int64_t in_;
};
TORCH_MODULE(SynthesisBlock);

/// Mapping network: "embed" FullyConnected c_dim -> w_dim (linear, lr 1; only with
/// c_dim > 0) and "fcs.0" .. "fcs.{L-1}", FullyConnected lrelu layers with lr multiplier
/// `lr_mul`, from concat(normalize_2nd_moment(z) (z_dim > 0), normalize_2nd_moment(embed(
/// one_hot(y)))) (c_dim > 0) to w_dim. With w_avg_beta > 0 it keeps the buffer "w_avg"
/// [w_dim] (init 0): a training-mode forward with `update_w_avg` sets
///   w_avg = lerp(mean of w over the global batch, w_avg, w_avg_beta),
/// the mean all-reduced over `comm` (a collective then: one all-reduce of w_dim + 1 float64
/// values), so every rank keeps the same w_avg whatever its share of the batch.
/// forward(z [N, z_dim] or undefined when z_dim = 0, y int64 [N] in [0, c_dim) or
/// undefined when c_dim = 0) -> w [N, w_dim] in the parameters' dtype. Throws
/// std::invalid_argument for a missing input.
class MappingNetworkImpl : public torch::nn::Module {
 public:
  MappingNetworkImpl(int64_t z_dim, int64_t c_dim, int64_t w_dim, int64_t num_layers, double lr_mul,
                     double w_avg_beta, Communicator* comm);
  at::Tensor forward(const at::Tensor& z, const at::Tensor& y, bool update_w_avg);
  FullyConnected embed{nullptr};
  torch::nn::ModuleList fcs{nullptr};
  at::Tensor w_avg;  ///< undefined without w_avg tracking

 private:
  int64_t z_dim_, c_dim_, w_dim_;
  double w_avg_beta_;
  Communicator* comm_;
};
TORCH_MODULE(MappingNetwork);

/// One resolution of D ('resnet' or 'orig'): "fromrgb" Conv2dLayer channels -> tmp 1x1 lrelu
/// (the first block only), "conv0" tmp -> tmp 3x3, "conv1" tmp -> out 3x3 down, and with
/// `resnet` "skip" tmp -> out 1x1 down without bias, linear. Output: resnet:
/// skip(x) sqrt(1/2) + conv1(conv0(x)) sqrt(1/2); orig: conv1(conv0(x)).
/// forward(x [N, tmp, R, R], or the image [N, channels, R, R] for the first block) ->
/// [N, out, R/2, R/2].
class DiscriminatorBlockImpl : public torch::nn::Module {
 public:
  DiscriminatorBlockImpl(bool first, int64_t tmp, int64_t out, int64_t channels, bool resnet);
  at::Tensor forward(const at::Tensor& x);
  Conv2dLayer fromrgb{nullptr}, conv0{nullptr}, conv1{nullptr}, skip{nullptr};
};
TORCH_MODULE(DiscriminatorBlock);

/// D's 4x4 epilogue: minibatch_stddev(group, F), "conv" Conv2dLayer (C + F) -> C 3x3 lrelu,
/// "fc" FullyConnected 16 C -> C lrelu, "out" FullyConnected C -> cmap_dim (conditional) or
/// 1, linear. Conditional (cmap_dim > 0): logits = sum_j out_j cmap_j / sqrt(cmap_dim)
/// (the projection of Miyato & Koyama 2018 onto D's label mapping).
/// forward(x [N, C, 4, 4], cmap [N, cmap_dim] or undefined when cmap_dim = 0) -> logits [N].
/// Throws std::invalid_argument (from minibatch_stddev) when N is not a multiple of
/// min(group, N).
class DiscriminatorEpilogueImpl : public torch::nn::Module {
 public:
  DiscriminatorEpilogueImpl(int64_t c, int64_t cmap_dim, int64_t mbstd_group, int64_t mbstd_channels);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cmap);
  Conv2dLayer conv{nullptr};
  FullyConnected fc{nullptr}, out{nullptr};

 private:
  int64_t cmap_dim_, mbstd_group_, mbstd_channels_;
};
TORCH_MODULE(DiscriminatorEpilogue);

/// The authors' initialization of every module of this header inside `m` (m included), in
/// modules() order, from torch's global generator. Local.
void initialize(torch::nn::Module& m);

}  // namespace shardgan::stylegan2
