#include "shardgan/nn/layers.h"

#include <torch/torch.h>

namespace shardgan {

bool computes_via_float32(const at::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
}

ConvTranspose2dImpl::ConvTranspose2dImpl(torch::nn::ConvTranspose2dOptions options)
    : options_(options) {
  torch::nn::ConvTranspose2d init(options);  // for LibTorch's default initialization
  weight = register_parameter("weight", init->weight.detach().clone());
  if (options.bias()) bias = register_parameter("bias", init->bias.detach().clone());
}

at::Tensor ConvTranspose2dImpl::forward(const at::Tensor& x) {
  namespace F = torch::nn::functional;
  auto opts = F::ConvTranspose2dFuncOptions()
                  .stride(options_.stride())
                  .padding(options_.padding())
                  .output_padding(options_.output_padding())
                  .dilation(options_.dilation())
                  .groups(options_.groups());
  if (!computes_via_float32(x)) return F::conv_transpose2d(x, weight, opts.bias(bias));
  at::Tensor b = bias.defined() ? bias.to(at::kFloat) : bias;
  return F::conv_transpose2d(x.to(at::kFloat), weight.to(at::kFloat), opts.bias(b)).to(x.scalar_type());
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Bias, when there is one, is added outside (in x's dtype), so autograd handles its gradient.
// `w_float` (no gradient), when not empty, is w already in float32 (custom functions take
// defined tensors only, so "none" is an empty tensor).
struct Conv2dViaFloat : torch::autograd::Function<Conv2dViaFloat> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor w, int64_t padding, int64_t stride,
                            at::Tensor w_float) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["stride"] = stride;
    const at::Tensor wf = w_float.numel() > 0 ? w_float : w.to(at::kFloat);
    return at::conv2d(x.to(at::kFloat), wf, {}, {stride, stride}, {padding, padding}).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t p = ctx->saved_data["padding"].toInt(), s = ctx->saved_data["stride"].toInt();
    const bool gx = ctx->needs_input_grad(0), gw = ctx->needs_input_grad(1);
    auto [dx, dw, db] = at::convolution_backward(grads[0].to(at::kFloat).contiguous(), x.to(at::kFloat),
                                                 w.to(at::kFloat), std::nullopt, {s, s}, {p, p}, {1, 1},
                                                 false, {0, 0}, 1, {gx, gw, false});
    return {gx ? dx.to(x.scalar_type()) : at::Tensor(), gw ? dw.to(w.scalar_type()) : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor conv2d_lowp(const at::Tensor& x, const at::Tensor& w, int64_t padding, int64_t stride,
                       const at::Tensor& bias, const at::Tensor& w_float) {
  if (!computes_via_float32(x)) return at::conv2d(x, w, bias, {stride, stride}, {padding, padding});
  const bool usable = w_float.defined() && w_float.scalar_type() == at::kFloat;
  at::Tensor y = Conv2dViaFloat::apply(x, w, padding, stride, usable ? w_float.detach() : at::empty({0}));
  return bias.defined() ? y + bias.view({1, -1, 1, 1}) : y;
}

Conv2dImpl::Conv2dImpl(torch::nn::Conv2dOptions options) {
  TORCH_CHECK(options.dilation()->at(0) == 1 && options.dilation()->at(1) == 1 && options.groups() == 1,
              "shardgan::Conv2d: only dilation 1 and groups 1");
  TORCH_CHECK(options.stride()->at(0) == options.stride()->at(1), "shardgan::Conv2d: only square strides");
  const auto* pad = std::get_if<torch::ExpandingArray<2>>(&options.padding());
  TORCH_CHECK(pad && (*pad)->at(0) == (*pad)->at(1), "shardgan::Conv2d: only equal numeric padding");
  stride_ = options.stride()->at(0);
  padding_ = (*pad)->at(0);
  torch::nn::Conv2d init(options);  // for LibTorch's default initialization
  weight = register_parameter("weight", init->weight.detach().clone());
  if (options.bias()) bias = register_parameter("bias", init->bias.detach().clone());
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) { return conv2d_lowp(x, weight, padding_, stride_, bias); }

}  // namespace shardgan
