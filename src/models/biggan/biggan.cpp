#include "shardgan/models/biggan.h"

#include <functional>
#include <stdexcept>

#include <torch/torch.h>

#include "models/biggan/layers.h"

namespace shardgan {
namespace {

using biggan::Init;
using Require = std::function<void(bool, const std::string&, const std::string&)>;

Init parse_init(const std::string& s) {
  if (s == "ortho") return Init::kOrtho;
  if (s == "N02") return Init::kN02;
  return Init::kXavier;  // validated before: "xavier"
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Checks every field; `require(ok, key, what)` reports the first bad one.
void validate(const BigGanConfig& c, const Require& require) {
  // Upper bounds keep every element count inside int64 (a width of 2^40 would overflow the
  // pre-flight's arithmetic); they are far past what any machine trains.
  constexpr int64_t kMaxDim = 1 << 16, kMaxMult = 1 << 10;
  require(c.ch > 0 && c.ch <= kMaxDim, "model.ch", "must be 1 to 65536");
  require(c.d_ch > 0 && c.d_ch <= kMaxDim, "model.d_ch", "must be 1 to 65536");
  const auto L = static_cast<int64_t>(c.g_ch_mult.size());
  require(L >= 2 && L <= 9, "model.g_ch_mult",
          "must list 2 to 9 multipliers (L entries give 4 * 2^(L-1) pixel images)");
  for (int64_t m : c.g_ch_mult) require(m > 0 && m <= kMaxMult, "model.g_ch_mult", "entries must be 1 to 1024");
  require(static_cast<int64_t>(c.d_ch_mult.size()) == L, "model.d_ch_mult",
          "must have as many entries as model.g_ch_mult (" + std::to_string(L) + ")");
  for (int64_t m : c.d_ch_mult) require(m > 0 && m <= kMaxMult, "model.d_ch_mult", "entries must be 1 to 1024");
  require(c.g_blocks_per_res >= 0 && c.g_blocks_per_res <= 1024, "model.g_blocks_per_res", "must be 0 to 1024");
  require(c.d_blocks_per_res >= 0 && c.d_blocks_per_res <= 1024, "model.d_blocks_per_res", "must be 0 to 1024");
  const int64_t res = int64_t{4} << (L - 1);
  const bool g_attn_ok = c.g_attn == 0 || (is_pow2(c.g_attn) && c.g_attn >= 8 && c.g_attn <= res);
  require(g_attn_ok, "model.g_attn",
          "must be 0 (none) or a power of two from 8 to the image size " + std::to_string(res));
  if (c.g_attn > 0) {  // channels at that resolution: C_i with 4 * 2^i = g_attn
    int64_t i = 0;
    while ((int64_t{4} << i) < c.g_attn) ++i;
    require(c.ch * c.g_ch_mult[i] >= 8, "model.g_attn",
            "needs at least 8 G channels at its resolution (model.ch * model.g_ch_mult)");
  }
  const bool d_attn_ok = c.d_attn == 0 || (is_pow2(c.d_attn) && c.d_attn >= 4 && c.d_attn < res);
  require(d_attn_ok, "model.d_attn",
          "must be 0 (none) or a power of two from 4 to half the image size " +
              std::to_string(res / 2));
  if (c.d_attn > 0) {  // the first group k with output resolution res / 2^(k+1)
    int64_t k = 0;
    while ((res >> (k + 1)) > c.d_attn) ++k;
    require(c.d_ch * c.d_ch_mult[k] >= 8, "model.d_attn",
            "needs at least 8 D channels at its resolution (model.d_ch * model.d_ch_mult)");
  }
  require(c.z_dim > 0 && c.z_dim <= kMaxDim, "model.z_dim", "must be 1 to 65536");
  require(c.z_dim % L == 0, "model.z_dim",
          "must be divisible by the number of latent chunks, " + std::to_string(L) +
              " (one for the first linear layer plus one per up-block, from model.g_ch_mult)");
  require(c.shared_dim > 0 && c.shared_dim <= kMaxDim, "model.shared_dim", "must be 1 to 65536");
  require(c.n_classes > 0 && c.n_classes <= (1 << 20), "model.n_classes", "must be 1 to 1048576");
  require(c.channels == 1 || c.channels == 3, "model.channels", "must be 1 or 3");
  require(c.init == "ortho" || c.init == "N02" || c.init == "xavier",
          "model.init", "must be ortho, N02 or xavier");
}

// A unit spec whose module is `make_module()`, initialized by `scheme` when asked.
template <typename Holder, typename MakeModule, typename Run>
UnitSpec unit(std::string name, Init scheme, MakeModule make_module, Run run) {
  return UnitSpec{std::move(name), [=](bool initialize) {
                    Holder m = make_module();
                    if (initialize) biggan::init_weights(*m, scheme);
                    return BuiltUnit{m.ptr(), [m, run](const TensorList& in) mutable {
                                       return run(m, in);
                                     }};
                  }};
}

// model.channels_last: a block's input in channels-last memory format (a no-op when it
// already is, as every block's output then is, except after the attention's reshapes).
at::Tensor layout(const at::Tensor& x, bool channels_last) {
  return channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
}

}  // namespace

BigGanFamily::BigGanFamily(BigGanConfig cfg) : cfg_(std::move(cfg)) {
  validate(cfg_, [](bool ok, const std::string& key, const std::string& what) {
    if (!ok) throw std::invalid_argument("BigGAN: `" + key + "` " + what);
  });
}

int64_t BigGanFamily::resolution() const { return int64_t{4} << (num_z_chunks() - 1); }

ImageShape BigGanFamily::image_shape() const {
  return ImageShape{cfg_.channels, resolution(), resolution()};
}

at::Tensor BigGanFamily::sample_latents(int64_t n, at::Generator& gen,
                                        at::ScalarType dtype) const {
  return at::randn({n, cfg_.z_dim}, gen, torch::TensorOptions().dtype(dtype));
}

ModelSpec BigGanFamily::generator(Communicator& comm) const {
  const BigGanConfig c = cfg_;
  const Init scheme = parse_init(c.init);
  const int64_t L = num_z_chunks(), chunk = c.z_dim / L, cond_dim = c.shared_dim + chunk;
  Communicator* cm = &comm;
  ModelSpec spec;
  spec.name = "generator";
  spec.sparse_params = {"shared.*"};  // the shared class embedding
  spec.units.push_back(unit<biggan::SNEmbedding>(
      "shared", scheme, [c] { return biggan::SNEmbedding(c.n_classes, c.shared_dim); },
      [](biggan::SNEmbedding& m, const TensorList& in) { return TensorList{m->forward(in[0])}; }));
  const int64_t c0 = c.ch * c.g_ch_mult[0];
  spec.units.push_back(unit<biggan::SNLinear>(
      "linear", scheme, [=] { return biggan::SNLinear(chunk, c0 * 16); },
      [c0](biggan::SNLinear& m, const TensorList& in) {
        at::Tensor h = m->forward(in[0]);
        return TensorList{h.view({h.size(0), c0, 4, 4})};
      }));
  // steps: (unit name, latent chunk of its cond, or -1 for the attention block)
  std::vector<std::pair<std::string, int64_t>> steps;
  int64_t n = 0;
  for (int64_t r = 0; r + 1 < L; ++r) {
    const int64_t out = c.ch * c.g_ch_mult[r + 1];
    for (int64_t j = 0; j <= c.g_blocks_per_res; ++j) {
      const int64_t in = j == 0 ? c.ch * c.g_ch_mult[r] : out;
      const bool up = j == 0;
      const std::string name = "block" + std::to_string(n++);
      spec.units.push_back(unit<biggan::GBlock>(
          name, scheme, [=] { return biggan::GBlock(in, out, cond_dim, up, cm, c.fused_upsample); },
          [cl = c.channels_last](biggan::GBlock& m, const TensorList& in) {
            return TensorList{m->forward(layout(in[0], cl), in[1])};
          }));
      steps.emplace_back(name, r + 1);
    }
    if (c.g_attn == (int64_t{4} << (r + 1))) {
      spec.units.push_back(unit<biggan::Attention>(
          "attn", scheme, [=] { return biggan::Attention(out); },
          [](biggan::Attention& m, const TensorList& in) { return TensorList{m->forward(in[0])}; }));
      steps.emplace_back("attn", -1);
    }
  }
  const int64_t c_last = c.ch * c.g_ch_mult.back();
  spec.units.push_back(unit<biggan::GOut>(
      "out", scheme, [=] { return biggan::GOut(c_last, c.channels, cm); },
      [cl = c.channels_last](biggan::GOut& m, const TensorList& in) {
        return TensorList{m->forward(layout(in[0], cl))};
      }));

  spec.program = [steps, chunk, L](ShardedModel& model, const TensorList& in) -> TensorList {
    if (in.size() < 2 || !in[0].defined() || !in[1].defined()) {
      throw std::invalid_argument("BigGAN G: expects {z [B, z_dim], y int64 [B]}");
    }
    const at::Tensor& z = in[0];
    if (z.dim() != 2 || z.size(1) != chunk * L) {
      throw std::invalid_argument("BigGAN G: z must be [B, " + std::to_string(chunk * L) + "]");
    }
    at::Tensor shared = model.unit("shared").forward(TensorList{in[1]})[0];
    std::vector<at::Tensor> zs = z.split(chunk, 1);
    at::Tensor h = model.unit("linear").forward(TensorList{zs[0]})[0];
    std::vector<at::Tensor> conds(static_cast<size_t>(L));  // built once per chunk
    for (const auto& [name, k] : steps) {
      if (k < 0) {
        h = model.unit(name).forward(TensorList{h})[0];
        continue;
      }
      at::Tensor& cond = conds[static_cast<size_t>(k)];
      if (!cond.defined()) cond = at::cat({shared, zs[k].to(shared.scalar_type())}, 1);
      h = model.unit(name).forward(TensorList{h, cond})[0];
    }
    return {model.unit("out").forward(TensorList{h})[0]};
  };
  return spec;
}

ModelSpec BigGanFamily::discriminator(Communicator& /*comm*/) const {
  const BigGanConfig c = cfg_;
  const Init scheme = parse_init(c.init);
  const int64_t L = num_z_chunks(), res = resolution();
  ModelSpec spec;
  spec.name = "discriminator";
  spec.sparse_params = {"out.embed.*"};  // the projection head's class embedding
  std::vector<std::string> order;
  int64_t n = 0, in = c.channels;
  bool attn_placed = false;
  for (int64_t k = 0; k < L; ++k) {
    const int64_t out = c.d_ch * c.d_ch_mult[k];
    const bool down_group = k + 1 < L;
    const int64_t out_res = down_group ? (res >> (k + 1)) : 4;
    for (int64_t j = 0; j <= c.d_blocks_per_res; ++j) {
      const bool pre = n > 0, down = down_group && j == 0;
      const int64_t bin = j == 0 ? in : out;
      const std::string name = "block" + std::to_string(n++);
      spec.units.push_back(unit<biggan::DBlock>(
          name, scheme, [=] { return biggan::DBlock(bin, out, pre, down); },
          [cl = c.channels_last](biggan::DBlock& m, const TensorList& x) {
            return TensorList{m->forward(layout(x[0], cl))};
          }));
      order.push_back(name);
    }
    in = out;
    if (!attn_placed && c.d_attn == out_res) {
      attn_placed = true;
      spec.units.push_back(unit<biggan::Attention>(
          "attn", scheme, [=] { return biggan::Attention(out); },
          [](biggan::Attention& m, const TensorList& x) { return TensorList{m->forward(x[0])}; }));
      order.push_back("attn");
    }
  }
  const int64_t d_last = in, n_classes = c.n_classes;
  const bool class_head = c.d_class_head;
  spec.units.push_back(unit<biggan::DOut>(
      "out", scheme, [=] { return biggan::DOut(d_last, n_classes, class_head); },
      [](biggan::DOut& m, const TensorList& x) { return m->forward(x[0], x[1]); }));

  spec.program = [order](ShardedModel& model, const TensorList& in) -> TensorList {
    if (in.size() < 2 || !in[0].defined() || !in[1].defined()) {
      throw std::invalid_argument("BigGAN D: expects {x [B, C, H, W], y int64 [B]}");
    }
    at::Tensor h = in[0];
    for (const auto& name : order) h = model.unit(name).forward(TensorList{h})[0];
    return model.unit("out").forward(TensorList{h, in[1]});  // {logits} or {logits, class logits}
  };
  return spec;
}

std::unique_ptr<ModelFamily> make_biggan_family(const BigGanConfig& cfg) {
  return std::make_unique<BigGanFamily>(cfg);
}

std::unique_ptr<ModelFamily> make_biggan_family(ConfigReader& r) {
  BigGanConfig c;
  c.ch = r.get<int64_t>("model.ch", c.ch, "BigGAN: G's base channel width");
  c.d_ch = r.get<int64_t>("model.d_ch", c.d_ch, "BigGAN: D's base channel width");
  c.g_ch_mult = r.get<std::vector<int64_t>>("model.g_ch_mult", c.g_ch_mult,
      "BigGAN: G's channel multipliers from 4x4 upwards; L entries give 4*2^(L-1)-pixel images");
  c.d_ch_mult = r.get<std::vector<int64_t>>("model.d_ch_mult", c.d_ch_mult,
      "BigGAN: D's channel multipliers from the input resolution downwards (as many as g_ch_mult)");
  c.g_blocks_per_res = r.get<int64_t>("model.g_blocks_per_res", c.g_blocks_per_res,
      "BigGAN: extra G blocks per resolution (deep variant)");
  c.d_blocks_per_res = r.get<int64_t>("model.d_blocks_per_res", c.d_blocks_per_res,
      "BigGAN: extra D blocks per resolution");
  c.g_attn = r.get<int64_t>("model.g_attn", c.g_attn,
      "BigGAN: output resolution of the G block the self-attention follows (0: none)");
  c.d_attn = r.get<int64_t>("model.d_attn", c.d_attn,
      "BigGAN: output resolution of the D block the self-attention follows (0: none)");
  c.z_dim = r.get<int64_t>("model.z_dim", c.z_dim, "latent size (BigGAN: divisible by the number of G resolutions)");
  c.shared_dim = r.get<int64_t>("model.shared_dim", c.shared_dim, "BigGAN: shared class-embedding size");
  c.n_classes = r.get<int64_t>("model.n_classes", c.n_classes, "BigGAN: number of classes");
  c.channels = r.get<int64_t>("model.channels", c.channels, "image channels, 1 or 3");
  c.init = r.get<std::string>("model.init", c.init, "BigGAN: weight init, ortho, N02 or xavier");
  c.channels_last = r.get<bool>("model.channels_last", c.channels_last,
      "BigGAN: compute activations in channels-last memory format (less transient memory on the CPU)");
  c.fused_upsample = r.get<bool>("model.fused_upsample", c.fused_upsample,
      "BigGAN: up-blocks convolve the low-resolution input instead of the upsampled one (less memory)");
  c.d_class_head = r.get<bool>("model.d_class_head", c.d_class_head,
      "BigGAN: D also has AC-GAN's auxiliary classifier head (trained by train.aux_class_weight)");
  validate(c, [&r](bool ok, const std::string& key, const std::string& what) {
    r.require(ok, key, what);
  });
  return make_biggan_family(c);
}

}  // namespace shardgan
