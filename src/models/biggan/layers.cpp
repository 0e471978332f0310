#include "models/biggan/layers.h"

#include "shardgan/nn/power_iteration.h"
#include "shardgan/sharding/activation_checkpoint.h"

#include <cmath>

#include <torch/torch.h>

#include "shardgan/nn/layers.h"

namespace shardgan::biggan {
namespace {

namespace F = torch::nn::functional;
using TensorList = std::vector<at::Tensor>;

// F.normalize(x, dim=1, eps) for a row vector: x / max(||x||, eps).
at::Tensor normalize_row(const at::Tensor& x, double eps) {
  return x / x.norm(2, {1}, /*keepdim=*/true).clamp_min(eps);
}

at::Tensor upsample2(const at::Tensor& x) {
  return at::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)});
}

at::Tensor pool2(const at::Tensor& x) { return at::avg_pool2d(x, {2, 2}); }

// PyTorch's default bias init for conv and linear layers.
void init_bias(at::Tensor& b, int64_t fan_in) {
  if (!b.defined()) return;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  torch::NoGradGuard g;
  b.uniform_(-bound, bound);
}

}  // namespace

namespace {

// sigma = u' W v^T from the power iteration's W v^T (so no second product with W), as an
// autograd function of W with u' and v held constant (Miyato et al. 2018, Alg. 1, where
// the gradient does not flow through u and v). Backward writes dsigma/dW = g u'^T v
// straight in W's dtype: no float32 copy of a 16-bit W and no [out, in] float32 temporary.
// Each element is the one float32 product (g u'_j) v_i that autograd through
// mm(mm(v, W^T), u'^T) gives, rounded once.
struct SigmaFromPowerIteration : torch::autograd::Function<SigmaFromPowerIteration> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w, const at::Tensor& wv,
                            const at::Tensor& v, const at::Tensor& u_new) {
    ctx->save_for_backward({v, u_new});
    ctx->saved_data["sizes"] = w.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(w.scalar_type());
    return at::mm(wv, u_new.t()).squeeze();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& v = saved[0];      // [1, in]
    const at::Tensor& u_new = saved[1];  // [1, out]
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor gu = grads[0].to(u_new.scalar_type()) * u_new;  // [1, out]
    at::Tensor gw = at::empty(sizes, v.options().dtype(dtype));      // [out, in]
    at::mul_out(gw, gu.t(), v);  // computed in float32 (or float64), rounded into W's dtype
    return {gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A float32 copy of W for ConvDivSigma (detached), or an empty tensor: custom autograd
// functions take defined tensors only.
at::Tensor float_or_empty(const at::Tensor& w_float) {
  return w_float.defined() && w_float.scalar_type() == at::kFloat ? w_float.detach() : at::empty({0});
}

// y = conv(x, W) / sigma (a transposed conv when `transposed`: W [in, out, k, k]) as one
// autograd function that saves x, W and sigma, not y. Autograd through `conv(x, W) / sigma`
// would save the conv's output for DivBackward (one more activation per layer from forward
// to backward) and make three activation-sized temporaries for sigma's gradient
// -sum(g * z) / sigma^2. Here that sum comes from the weight gradient instead: z is linear
// in W, so sum(g * z) = <W, dz/dW^T g> (Euler's theorem for a function homogeneous of
// degree 1), a weight-sized product. Backward: dx = conv_x^T(g) / sigma,
// dW = conv_W^T(g) / sigma, dsigma = -<W, dW> / sigma. Where computes_via_float32(x)
// (shardgan/nn/layers.h), it computes in float32 and rounds y once, as conv2d_lowp; `w_float`,
// when not empty, is W in float32 already. Differentiable twice (R1) through
// at::convolution_backward.
struct ConvDivSigma : torch::autograd::Function<ConvDivSigma> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& sigma, const at::Tensor& w_float, int64_t padding, int64_t stride,
                            bool transposed) {
    ctx->save_for_backward({x, w, sigma});
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["transposed"] = transposed;
    const bool low = computes_via_float32(x);
    const at::Tensor wc = !low ? w : w_float.numel() > 0 ? w_float : w.to(at::kFloat);
    at::Tensor y = at::convolution(low ? x.to(at::kFloat) : x, wc, {}, {stride, stride}, {padding, padding}, {1, 1},
                                   transposed, {0, 0}, 1);
    y.div_(sigma);
    return low ? y.to(x.scalar_type()) : y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &sigma = saved[2];
    const int64_t p = ctx->saved_data["padding"].toInt(), s = ctx->saved_data["stride"].toInt();
    const bool transposed = ctx->saved_data["transposed"].toBool();
    const bool low = computes_via_float32(x);
    const bool gx = ctx->needs_input_grad(0), gw = ctx->needs_input_grad(1), gs = ctx->needs_input_grad(2);
    const at::Tensor wc = low ? w.to(at::kFloat) : w;
    const at::Tensor g = low ? grads[0].to(at::kFloat).contiguous() : grads[0];
    auto [dx, dwz, db] = at::convolution_backward(g, low ? x.to(at::kFloat) : x, wc, std::nullopt, {s, s}, {p, p},
                                                  {1, 1}, transposed, {0, 0}, 1, {gx, gw || gs, false});
    at::Tensor dw, dsigma;
    if (gw || gs) dw = dwz / sigma;
    if (gs) dsigma = -(dw * wc).sum().to(sigma.scalar_type()) / sigma;
    // dx is divided in place unless this backward builds a graph (R1): the same bits, and no
    // second input-sized buffer beside it.
    if (gx) dx = at::GradMode::is_enabled() ? dx / sigma : dx.div_(sigma);
    return {gx ? dx.to(x.scalar_type()) : at::Tensor(), gw ? dw.to(w.scalar_type()) : at::Tensor(), dsigma,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The power iteration and sigma of `weight` viewed as [out, in]. `w_float`, when given,
// receives W in u's dtype (the copy the power iteration needs anyway; W itself when the
// dtypes agree), for the layer to reuse.
at::Tensor spectral_sigma(const at::Tensor& weight, at::Tensor& u, bool update, double eps,
                          at::Tensor* w_float = nullptr) {
  TORCH_CHECK(weight.dim() >= 2, "spectral_normalize: weight must be at least 2-D, got ",
              weight.sizes());
  TORCH_CHECK(u.dim() == 2 && u.size(0) == 1 && u.size(1) == weight.size(0),
              "spectral_normalize: u must be [1, ", weight.size(0), "], got ", u.sizes());
  const at::Tensor w = weight.reshape({weight.size(0), -1});  // [out, in], differentiable
  at::Tensor v, wv, u_new;
  {
    torch::NoGradGuard no_grad;
    // The power iteration runs in u's (master) dtype, so that a bfloat16 weight does not
    // round the singular vectors that persist from step to step.
    const at::Tensor wm = w.detach().to(u.scalar_type());
    v = normalize_row(at::mm(u, wm), eps);      // [1, in]
    wv = at::mm(v, wm.t());                     // [1, out]
    u_new = normalize_row(wv, eps);             // [1, out]
    if (update) u.copy_(u_new);
    if (w_float) *w_float = wm.view(weight.sizes());
  }
  // sigma in at least float32: a bfloat16 product keeps 8 bits of the sum over `in`, and
  // every output is divided by it.
  const auto dt = at::promote_types(weight.scalar_type(), at::kFloat);
  return SigmaFromPowerIteration::apply(w, wv.to(dt), v.to(dt), u_new.to(dt));
}

}  // namespace

std::pair<at::Tensor, at::Tensor> spectral_normalize(const at::Tensor& weight, at::Tensor& u,
                                                     bool update, double eps) {
  at::Tensor sigma = spectral_sigma(weight, u, update, eps);
  return {weight / sigma, sigma};
}

at::Tensor SNBase::sigma(at::Tensor* w_float) {
  // A checkpointed unit's replay in backward sees u as it was at the forward and must not
  // advance it again (its buffers are restored afterwards anyway; this keeps the count).
  const bool advance = is_training() && !power_iteration_paused() && !recomputing_activations();
  at::Tensor s = spectral_sigma(weight, u, advance, kSnEps, w_float);
  if (advance) ++advances_;
  last_sigma_ = s.detach();
  return s;
}

SNConv2dImpl::SNConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t padding, bool bias_on)
    : padding_(padding) {
  weight = register_parameter("weight", torch::empty({out, in, kernel, kernel}));
  if (bias_on) bias = register_parameter("bias", torch::empty({out}));
  u = register_buffer("u", torch::randn({1, out}));
}

at::Tensor SNConv2dImpl::forward(const at::Tensor& x) {
  // sigma first: its power iteration's float32 copy of a 16-bit W is the one the
  // convolution computes with (one conversion of W per forward instead of two).
  at::Tensor w_float;
  const at::Tensor s = sigma(&w_float);
  at::Tensor y = ConvDivSigma::apply(x, weight, s, float_or_empty(w_float), padding_, 1, false);
  // y is fresh and ConvDivSigma did not save it, so the bias goes in in place (the same
  // bits, one output-sized buffer fewer while it is added).
  return bias.defined() ? y.add_(bias.view({1, -1, 1, 1})) : y;
}

at::Tensor SNConv2dImpl::forward_upsampled(const at::Tensor& x) {
  const int64_t k = weight.size(2);
  TORCH_CHECK((k == 3 && padding_ == 1) || (k == 1 && padding_ == 0),
              "SNConv2d::forward_upsampled: needs a 3x3 conv with padding 1 or a 1x1 with padding 0, got ", k, "x",
              k, " with padding ", padding_);
  if (k == 1) return upsample2(forward(x));  // a 1x1 conv commutes with the upsampling
  const at::Tensor s = sigma();
  // A 16-bit W's kernel sums in float32, which the CPU's 16-bit path computes in anyway.
  const at::Tensor w = computes_via_float32(x) ? weight.to(at::kFloat) : weight;
  at::Tensor y = ConvDivSigma::apply(x, upsample_conv_kernel(w), s, at::empty({0}), /*padding=*/1, /*stride=*/2,
                                     /*transposed=*/true);
  return bias.defined() ? y.add_(bias.view({1, -1, 1, 1})) : y;  // in place, as in forward()
}

at::Tensor upsample_conv_kernel(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 4 && w.size(2) == 3 && w.size(3) == 3, "upsample_conv_kernel: expected [out, in, 3, 3], got ",
              w.sizes());
  // [w_2, w_1 + w_2, w_0 + w_1, w_0] along `dim`.
  auto fold = [](const at::Tensor& t, int64_t dim) {
    const at::Tensor a = t.select(dim, 0), b = t.select(dim, 1), c = t.select(dim, 2);
    return at::stack({c, b + c, a + b, a}, dim);
  };
  return fold(fold(w, 2), 3).transpose(0, 1).contiguous();
}

SNLinearImpl::SNLinearImpl(int64_t in, int64_t out, bool bias_on) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (bias_on) bias = register_parameter("bias", torch::empty({out}));
  u = register_buffer("u", torch::randn({1, out}));
}

at::Tensor SNLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight) / sigma();
  return bias.defined() ? y + bias : y;
}

SNEmbeddingImpl::SNEmbeddingImpl(int64_t n, int64_t dim) {
  weight = register_parameter("weight", torch::empty({n, dim}));
  u = register_buffer("u", torch::randn({1, n}));
}

at::Tensor SNEmbeddingImpl::forward(const at::Tensor& y) {
  return at::embedding(weight, y) / sigma();
}

CCBNImpl::CCBNImpl(int64_t channels, int64_t cond_dim, Communicator* comm) : comm_(comm) {
  gain = register_module("gain", SNLinear(cond_dim, channels, /*bias=*/false));
  bias = register_module("bias", SNLinear(cond_dim, channels, /*bias=*/false));
  running_mean = register_buffer("running_mean", torch::zeros({channels}));
  running_var = register_buffer("running_var", torch::ones({channels}));
}

at::Tensor CCBNImpl::forward(const at::Tensor& x, const at::Tensor& cond) {
  auto [scale, shift] = scale_shift(cond);
  return apply(x, scale, shift);
}

std::pair<at::Tensor, at::Tensor> CCBNImpl::scale_shift(const at::Tensor& cond) {
  TORCH_CHECK(cond.dim() == 2, "ccbn: expected cond [B, D], got ", cond.sizes());
  const int64_t b = cond.size(0);
  return {(gain->forward(cond) + 1.0).view({b, -1, 1, 1}), bias->forward(cond).view({b, -1, 1, 1})};
}

at::Tensor CCBNImpl::apply(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift) {
  TORCH_CHECK(x.dim() == 4 && scale.dim() == 4 && scale.size(0) == x.size(0),
              "ccbn: expected x [B, C, H, W] and a scale [B, C, 1, 1], got ", x.sizes(), " and ",
              scale.sizes());
  at::Tensor xhat = sync_batch_norm(x, at::Tensor(), at::Tensor(), running_mean, running_var,
                                    is_training(), kBnEps, kBnMomentum, comm_);
  at::Tensor y = xhat * scale;  // the product is not saved: shift is added in place (same bits)
  return y.add_(shift);
}

AttentionImpl::AttentionImpl(int64_t ch) : ch_(ch) {
  TORCH_CHECK(ch >= 8, "Attention: needs at least 8 channels, got ", ch);
  theta = register_module("theta", SNConv2d(ch, ch / 8, 1, 0, false));
  phi = register_module("phi", SNConv2d(ch, ch / 8, 1, 0, false));
  g = register_module("g", SNConv2d(ch, ch / 2, 1, 0, false));
  o = register_module("o", SNConv2d(ch / 2, ch, 1, 0, false));
  gamma = register_parameter("gamma", torch::zeros({1}));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == ch_ && x.size(2) % 2 == 0 && x.size(3) % 2 == 0,
              "Attention: expected [B, ", ch_, ", H, W] with even H and W, got ", x.sizes());
  const int64_t b = x.size(0), h = x.size(2), w = x.size(3), hw = h * w;
  at::Tensor th = theta->forward(x).view({b, ch_ / 8, hw});
  at::Tensor ph = at::max_pool2d(phi->forward(x), {2, 2}).view({b, ch_ / 8, hw / 4});
  at::Tensor gg = at::max_pool2d(g->forward(x), {2, 2}).view({b, ch_ / 2, hw / 4});
  at::Tensor beta = at::softmax(at::bmm(th.transpose(1, 2), ph), -1);  // [B, hw, hw/4]
  // BigGAN-PyTorch's bmm(g, beta^T), computed as bmm(beta, g^T)^T: the same products, but
  // the gradient reaching beta is then contiguous, so softmax's backward does not copy it
  // (one [B, hw, hw/4] buffer fewer, the largest tensor of the unit's backward).
  at::Tensor gb = at::bmm(beta, gg.transpose(1, 2)).transpose(1, 2).reshape({b, ch_ / 2, h, w});
  at::Tensor out = o->forward(gb);
  return x + gamma * out;
}

GBlockImpl::GBlockImpl(int64_t in, int64_t out, int64_t cond_dim, bool upsample,
                       Communicator* comm, bool fused_upsample)
    : upsample_(upsample), fused_(fused_upsample) {
  conv1 = register_module("conv1", SNConv2d(in, out, 3, 1));
  conv2 = register_module("conv2", SNConv2d(out, out, 3, 1));
  if (in != out || upsample) conv_sc = register_module("conv_sc", SNConv2d(in, out, 1, 0));
  bn1 = register_module("bn1", CCBN(in, cond_dim, comm));
  bn2 = register_module("bn2", CCBN(out, cond_dim, comm));
}

at::Tensor GBlockImpl::forward(const at::Tensor& x_in, const at::Tensor& cond) {
  // The four conditional scales and shifts first, outside the segments: `cond` feeds all
  // four, and its gradient then sums their terms in the unit's own graph, in the same order
  // with and without checkpoint segments (the same bits). Each segment's inputs are used
  // once, or twice (x_in), where the order of a sum does not matter.
  auto [scale1, shift1] = bn1->scale_shift(cond);
  auto [scale2, shift2] = bn2->scale_shift(cond);
  at::Tensor h = checkpoint_segment({bn1.get(), conv1.get()}, [this](const TensorList& in) {
    at::Tensor a = bn1->apply(in[0], in[1], in[2]).relu_();  // CCBN's output is fresh and unsaved
    return TensorList{conv_up(conv1, a)};
  }, {x_in, scale1, shift1})[0];
  h = checkpoint_segment({bn2.get(), conv2.get()}, [this](const TensorList& in) {
    return TensorList{conv2->forward(bn2->apply(in[0], in[1], in[2]).relu_())};
  }, {h, scale2, shift2})[0];
  at::Tensor x = x_in;
  if (conv_sc) {
    x = checkpoint_segment({conv_sc.get()}, [this](const TensorList& in) {
      return TensorList{conv_up(conv_sc, in[0])};
    }, {x_in})[0];
  } else if (upsample_) {
    x = upsample2(x);
  }
  return h + x;
}

at::Tensor GBlockImpl::conv_up(SNConv2d& conv, const at::Tensor& x) {
  if (!upsample_) return conv->forward(x);
  return fused_ ? conv->forward_upsampled(x) : conv->forward(upsample2(x));
}

DBlockImpl::DBlockImpl(int64_t in, int64_t out, bool preactivation, bool downsample)
    : preactivation_(preactivation), downsample_(downsample) {
  conv1 = register_module("conv1", SNConv2d(in, out, 3, 1));
  conv2 = register_module("conv2", SNConv2d(out, out, 3, 1));
  if (in != out || downsample) conv_sc = register_module("conv_sc", SNConv2d(in, out, 1, 0));
}

at::Tensor DBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = checkpoint_segment({conv1.get(), conv2.get()}, [this](const TensorList& in) {
    at::Tensor a = conv2->forward(conv1->forward(preactivation_ ? at::relu(in[0]) : in[0]).relu_());
    return TensorList{downsample_ ? pool2(a) : a};
  }, {x})[0];
  at::Tensor sc = x;
  if (preactivation_) {
    if (conv_sc) sc = conv_sc->forward(sc);
    if (downsample_) sc = pool2(sc);
  } else {
    if (downsample_) sc = pool2(sc);
    if (conv_sc) sc = conv_sc->forward(sc);
  }
  return h + sc;
}

GOutImpl::GOutImpl(int64_t ch, int64_t channels, Communicator* comm) : comm_(comm) {
  bn = register_module("bn", SyncBatchNorm2d(ch, comm, kBnEps, kBnMomentum));
  conv = register_module("conv", SNConv2d(ch, channels, 3, 1));
}

at::Tensor GOutImpl::forward(const at::Tensor& x) {
  // The functional form keeps eval-mode outputs in x's dtype under mixed precision.
  at::Tensor h = sync_batch_norm(x, bn->weight, bn->bias, bn->running_mean, bn->running_var,
                                 is_training(), kBnEps, kBnMomentum, comm_);
  return at::tanh(conv->forward(at::relu(h)));
}

DOutImpl::DOutImpl(int64_t ch, int64_t n_classes, bool class_head) {
  linear = register_module("linear", SNLinear(ch, 1));
  embed = register_module("embed", SNEmbedding(n_classes, ch));
  if (class_head) classes = register_module("classes", SNLinear(ch, n_classes));
}

std::vector<at::Tensor> DOutImpl::forward(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(y.defined() && y.dim() == 1 && y.size(0) == x.size(0),
              "DOut: expected labels [", x.size(0), "]");
  at::Tensor h = at::relu(x).sum({2, 3});                         // [B, ch]
  at::Tensor out = linear->forward(h).squeeze(1);                 // [B]
  out = out + (embed->forward(y) * h).sum(1);
  if (!classes) return {out};
  return {out, classes->forward(h)};                              // [B], [B, n_classes]
}

void init_weights(torch::nn::Module& m, Init scheme) {
  torch::NoGradGuard no_grad;
  for (auto& mod : m.modules(/*include_self=*/true)) {
    auto* sn = dynamic_cast<SNBase*>(mod.get());
    if (sn == nullptr) continue;
    at::Tensor& w = sn->weight;
    switch (scheme) {
      case Init::kOrtho:
        torch::nn::init::orthogonal_(w);
        break;
      case Init::kN02:
        w.normal_(0.0, 0.02);
        break;
      case Init::kXavier:
        torch::nn::init::xavier_uniform_(w);
        break;
    }
    const int64_t fan_in = w.numel() / w.size(0);
    if (auto* c = dynamic_cast<SNConv2dImpl*>(sn)) init_bias(c->bias, fan_in);
    if (auto* l = dynamic_cast<SNLinearImpl*>(sn)) init_bias(l->bias, fan_in);
  }
}

}  // namespace shardgan::biggan
