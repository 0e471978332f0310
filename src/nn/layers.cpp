#include "shardgan/nn/layers.h"

#include <torch/torch.h>

namespace shardgan {

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
  const bool low = x.device().is_cpu() &&
                   (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
  if (!low) return F::conv_transpose2d(x, weight, opts.bias(bias));
  at::Tensor b = bias.defined() ? bias.to(at::kFloat) : bias;
  return F::conv_transpose2d(x.to(at::kFloat), weight.to(at::kFloat), opts.bias(b)).to(x.scalar_type());
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Conv2dViaFloat : torch::autograd::Function<Conv2dViaFloat> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor w, int64_t padding) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["padding"] = padding;
    return at::conv2d(x.to(at::kFloat), w.to(at::kFloat), {}, {1, 1}, {padding, padding}).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t p = ctx->saved_data["padding"].toInt();
    const bool gx = ctx->needs_input_grad(0), gw = ctx->needs_input_grad(1);
    auto [dx, dw, db] = at::convolution_backward(grads[0].to(at::kFloat).contiguous(), x.to(at::kFloat),
                                                 w.to(at::kFloat), c10::nullopt, {1, 1}, {p, p}, {1, 1},
                                                 false, {0, 0}, 1, {gx, gw, false});
    return {gx ? dx.to(x.scalar_type()) : at::Tensor(), gw ? dw.to(w.scalar_type()) : at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor conv2d_lowp(const at::Tensor& x, const at::Tensor& w, int64_t padding) {
  const bool low = x.device().is_cpu() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
  if (!low) return at::conv2d(x, w, {}, {1, 1}, {padding, padding});
  return Conv2dViaFloat::apply(x, w, padding);
}

}  // namespace shardgan
