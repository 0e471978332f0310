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

}  // namespace shardgan
