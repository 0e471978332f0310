#include "shardgan/nn/sync_batchnorm.h"

#include <torch/torch.h>

namespace shardgan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Communicator* comm_from(AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
}

struct SyncBatchNormFn : torch::autograd::Function<SyncBatchNormFn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor weight,
                            at::Tensor bias, at::Tensor running_mean, at::Tensor running_var,
                            double eps, double momentum, int64_t comm_ptr) {
    auto* comm = reinterpret_cast<Communicator*>(comm_ptr);
    const int64_t c = x.size(1);
    const std::vector<int64_t> dims{0, 2, 3};
    // Statistics accumulate in float64 whatever the compute dtype, so that E[x^2] - E[x]^2
    // does not cancel catastrophically in float32.
    // The full-size temporaries are made in place where the values allow it (the same
    // arithmetic, so the same bits): the peak of a checkpointed replay is here or in the
    // backward below.
    at::Tensor stats = torch::empty({2 * c + 1}, x.options().dtype(at::kDouble));
    {
      at::Tensor xd = x.to(at::kDouble);  // one conversion (a no-op for float64 input)
      stats.narrow(0, 0, c).copy_(xd.sum(dims));
      if (xd.is_same(x)) {
        xd = xd * xd;
      } else {
        xd.mul_(xd);  // x's float64 copy becomes its square: no second float64 buffer
      }
      stats.narrow(0, c, c).copy_(xd.sum(dims));
    }
    stats[2 * c] = static_cast<double>(x.numel() / c);
    comm->all_reduce(stats, ReduceOp::kSum);
    const double n = stats[2 * c].item<double>();
    at::Tensor mean = stats.narrow(0, 0, c) / n;
    at::Tensor var = (stats.narrow(0, c, c) / n - mean * mean).clamp_min(0.0);
    at::Tensor invstd = (var + eps).rsqrt();
    {
      torch::NoGradGuard g;
      running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      const double unbias = n > 1 ? n / (n - 1) : 1.0;
      running_var.mul_(1.0 - momentum).add_(var.to(running_var.scalar_type()), momentum * unbias);
    }
    auto shape = std::vector<int64_t>{1, c, 1, 1};
    at::Tensor mean_x = mean.to(x.scalar_type()).view(shape);
    at::Tensor invstd_x = invstd.to(x.scalar_type()).view(shape);
    at::Tensor xhat = x - mean_x;
    xhat.mul_(invstd_x);
    ctx->save_for_backward({xhat, invstd_x, weight});
    ctx->saved_data["comm"] = comm_ptr;
    ctx->saved_data["n"] = n;
    // Non-affine (class-conditional BN applies its own gain and bias): weight and bias come
    // as empty placeholders, since autograd functions take no undefined inputs in 1.13.
    const bool affine = weight.numel() > 0;
    ctx->saved_data["affine"] = affine;
    if (!affine) return xhat;
    at::Tensor y = xhat * weight.view(shape);
    return y.add_(bias.view(shape));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // Grad mode is on inside a backward only when it builds a graph (create_graph=true):
    // the all-reduce below is not differentiable, so the second-order terms from other
    // ranks would be silently missing.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "SyncBatchNorm has no double backward (create_graph=true, e.g. an R1 or "
                "gradient penalty, train.r1_gamma): its cross-rank statistics are not "
                "differentiated twice. Use a discriminator without BatchNorm (BigGAN's and "
                "StyleGAN's have none: model.arch biggan), or turn the penalty off");
    auto saved = ctx->get_saved_variables();
    at::Tensor xhat = saved[0], invstd = saved[1], weight = saved[2];
    // Dense in xhat's layout (channels-last stays channels-last: no NCHW copy).
    at::Tensor dy = grads[0].contiguous(xhat.suggest_memory_format());
    const double n = ctx->saved_data["n"].toDouble();
    const int64_t c = xhat.size(1);
    const std::vector<int64_t> dims{0, 2, 3};
    at::Tensor sum_dy = dy.sum(dims);
    at::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    at::Tensor red = torch::cat({sum_dy, sum_dy_xhat});
    comm_from(ctx)->all_reduce(red, ReduceOp::kSum);
    auto shape = std::vector<int64_t>{1, c, 1, 1};
    at::Tensor mean_dy = (red.narrow(0, 0, c) / n).view(shape);
    at::Tensor mean_dy_xhat = (red.narrow(0, c, c) / n).view(shape);
    const bool affine = ctx->saved_data["affine"].toBool();
    at::Tensor scale = affine ? invstd * weight.view(shape) : invstd;
    // (dy - mean_dy - xhat * mean_dy_xhat) * scale, with one full-size temporary.
    at::Tensor dx = dy - mean_dy;
    dx.sub_(xhat * mean_dy_xhat);
    dx.mul_(scale);
    // Local parameter gradients: the data-parallel gradient average makes them global.
    at::Tensor dweight = affine ? sum_dy_xhat : at::Tensor();
    at::Tensor dbias = affine ? sum_dy : at::Tensor();
    return {dx, dweight, dbias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor sync_batch_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var,
                           bool training, double eps, double momentum, Communicator* comm) {
  TORCH_CHECK(x.dim() == 4, "sync_batch_norm: expected [B, C, H, W], got ", x.sizes());
  const int64_t c = x.size(1);
  TORCH_CHECK(running_mean.numel() == c && running_var.numel() == c,
              "sync_batch_norm: running statistics have ", running_mean.numel(), " and ",
              running_var.numel(), " elements for ", c, " channels");
  TORCH_CHECK(weight.defined() == bias.defined(),
              "sync_batch_norm: weight and bias must both be defined or both undefined");
  TORCH_CHECK(!weight.defined() || (weight.numel() == c && bias.numel() == c),
              "sync_batch_norm: weight/bias must have ", c, " elements");
  if (!training) {
    auto shape = std::vector<int64_t>{1, c, 1, 1};
    const auto dt = x.scalar_type();
    at::Tensor out = (x - running_mean.to(dt).view(shape)) *
                     (running_var.to(dt).view(shape) + eps).rsqrt();
    if (weight.defined()) out = out * weight.view(shape) + bias.view(shape);
    return out;
  }
  TORCH_CHECK(comm != nullptr, "sync_batch_norm: training mode needs a communicator");
  const at::Tensor none = weight.defined() ? at::Tensor() : at::empty({0}, x.options());
  return SyncBatchNormFn::apply(x.contiguous(x.suggest_memory_format()), weight.defined() ? weight : none,
                                bias.defined() ? bias : none, running_mean, running_var, eps,
                                momentum, reinterpret_cast<int64_t>(comm));
}

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(int64_t channels, Communicator* comm, double eps,
                                         double momentum)
    : channels_(channels), comm_(comm), eps_(eps), momentum_(momentum) {
  weight = register_parameter("weight", torch::ones({channels}));
  bias = register_parameter("bias", torch::zeros({channels}));
  running_mean = register_buffer("running_mean", torch::zeros({channels}));
  running_var = register_buffer("running_var", torch::ones({channels}));
}

at::Tensor SyncBatchNorm2dImpl::forward(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == channels_, "SyncBatchNorm2d: expected [B, ",
              channels_, ", H, W], got ", x.sizes());
  if (!is_training()) {
    auto shape = std::vector<int64_t>{1, channels_, 1, 1};
    return (x - running_mean.view(shape)) * (running_var.view(shape) + eps_).rsqrt() *
               weight.view(shape) + bias.view(shape);
  }
  return SyncBatchNormFn::apply(x.contiguous(x.suggest_memory_format()), weight, bias, running_mean, running_var, eps_,
                                momentum_, reinterpret_cast<int64_t>(comm_));
}

}  // namespace shardgan
