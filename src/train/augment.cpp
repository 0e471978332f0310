// ADA's augmentation pipeline (augment.h): the per-sample matrices of the paper's bgc
// transforms (Karras et al. 2020, arXiv:2006.06676, Appendix B) and their execution.
#include "shardgan/train/augment.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace shardgan {

AugmentStrengths AugmentStrengths::of_pipe(const std::string& name) {
  AugmentStrengths s;
  const bool blit = name == "blit" || name == "bg" || name == "bgc";
  const bool geom = name == "geom" || name == "bg" || name == "bgc";
  const bool color = name == "color" || name == "bgc";
  if (!blit && !geom && !color) {
    throw std::invalid_argument("augment pipe '" + name + "': must be blit, geom, color, bg or bgc");
  }
  if (blit) s.xflip = s.rotate90 = s.xint = 1;
  if (geom) s.scale = s.rotate = s.aniso = s.xfrac = 1;
  if (color) s.brightness = s.contrast = s.lumaflip = s.hue = s.saturation = 1;
  return s;
}

namespace {

namespace ad = augment_draw;
using C = AugmentConstants;

// A batch of matrices [N, R, R] from R x R entries, each [N].
at::Tensor batch_matrix(const std::vector<std::vector<at::Tensor>>& rows) {
  std::vector<at::Tensor> r;
  r.reserve(rows.size());
  for (const auto& row : rows) r.push_back(torch::stack(row, -1));
  return torch::stack(r, -2);
}

// The 2-D homogeneous maps (3x3) and the 3-D colour maps (4x4), per sample.
struct Maps {
  at::Tensor zero, one;  // [N]
  at::Tensor scale2d(const at::Tensor& sx, const at::Tensor& sy) const {
    return batch_matrix({{sx, zero, zero}, {zero, sy, zero}, {zero, zero, one}});
  }
  at::Tensor translate2d(const at::Tensor& tx, const at::Tensor& ty) const {
    return batch_matrix({{one, zero, tx}, {zero, one, ty}, {zero, zero, one}});
  }
  at::Tensor rotate2d(const at::Tensor& t) const {
    return batch_matrix({{t.cos(), -t.sin(), zero}, {t.sin(), t.cos(), zero}, {zero, zero, one}});
  }
  at::Tensor translate3d(const at::Tensor& t) const {
    return batch_matrix({{one, zero, zero, t}, {zero, one, zero, t}, {zero, zero, one, t}, {zero, zero, zero, one}});
  }
  at::Tensor scale3d(const at::Tensor& s) const {
    return batch_matrix({{s, zero, zero, zero}, {zero, s, zero, zero}, {zero, zero, s, zero}, {zero, zero, zero, one}});
  }
  // Rotation by t about the unit axis (a, a, a) (the luma axis), Rodrigues' formula.
  at::Tensor rotate_luma(const at::Tensor& t) const {
    const double a = 1.0 / std::sqrt(3.0);
    const at::Tensor c = t.cos(), s = t.sin(), cc = 1 - c;
    const at::Tensor d = a * a * cc + c, o1 = a * a * cc - a * s, o2 = a * a * cc + a * s;
    return batch_matrix({{d, o1, o2, zero}, {o2, d, o1, zero}, {o1, o2, d, zero}, {zero, zero, zero, one}});
  }
};

// x where the gate draw is below `prob`, else `off`.
at::Tensor gated(const at::Tensor& gate, double prob, const at::Tensor& x, double off) {
  return torch::where(gate < prob, x, torch::full_like(x, off));
}

}  // namespace

AugmentMatrices augment_matrices(const AugmentStrengths& s, double p, const at::Tensor& u, const at::Tensor& z,
                                 int64_t channels, int64_t height, int64_t width) {
  if (u.dim() != 2 || u.size(1) != ad::kUniforms || z.dim() != 2 || z.size(1) != ad::kNormals ||
      z.size(0) != u.size(0)) {
    throw std::invalid_argument("augment_matrices: draws must be [N, " + std::to_string(ad::kUniforms) + "] and [N, " +
                                std::to_string(ad::kNormals) + "]");
  }
  const at::Tensor uu = u.to(torch::kCPU, torch::kDouble), zz = z.to(torch::kCPU, torch::kDouble);
  auto U = [&](int64_t c) { return uu.select(1, c); };
  auto Z = [&](int64_t c) { return zz.select(1, c); };
  const int64_t n = u.size(0);
  Maps m{torch::zeros({n}, torch::kDouble), torch::ones({n}, torch::kDouble)};
  AugmentMatrices r;
  // Geometric: the inverse map, composed on the right (output to input), in the paper's order.
  at::Tensor g = torch::eye(3, torch::kDouble).expand({n, 3, 3}).contiguous();
  auto on = [&](double strength) { return strength > 0 && p > 0; };
  if (on(s.xflip)) {
    const at::Tensor i = gated(U(ad::kXflipGate), s.xflip * p, torch::floor(U(ad::kXflipSide) * 2), 0);
    g = g.bmm(m.scale2d(1 - 2 * i, m.one));  // its own inverse
  }
  if (on(s.rotate90)) {
    const at::Tensor i = gated(U(ad::kRotate90Gate), s.rotate90 * p, torch::floor(U(ad::kRotate90Turns) * 4), 0);
    g = g.bmm(m.rotate2d(i * (M_PI / 2)));  // the inverse of a turn by -i pi/2
  }
  if (on(s.xint)) {
    const at::Tensor gate = U(ad::kXintGate);
    const at::Tensor tx = gated(gate, s.xint * p, (U(ad::kXintX) * 2 - 1) * C::kXintMax, 0);
    const at::Tensor ty = gated(gate, s.xint * p, (U(ad::kXintY) * 2 - 1) * C::kXintMax, 0);
    g = g.bmm(m.translate2d(-torch::round(tx * width), -torch::round(ty * height)));
  }
  if (on(s.scale)) {
    const at::Tensor k = gated(U(ad::kScaleGate), s.scale * p, torch::exp2(Z(ad::kScale) * C::kScaleStd), 1);
    g = g.bmm(m.scale2d(k.reciprocal(), k.reciprocal()));
  }
  // The rotation runs twice (around the anisotropic scaling), each with the probability
  // that makes "either" happen with probability strength * p.
  const double p_rot = 1 - std::sqrt(std::min(std::max(1 - s.rotate * p, 0.0), 1.0));
  if (on(s.rotate)) {
    const at::Tensor t = gated(U(ad::kRotatePreGate), p_rot, (U(ad::kRotatePreAngle) * 2 - 1) * (M_PI * C::kRotateMax), 0);
    g = g.bmm(m.rotate2d(t));  // the inverse of a rotation by -t
  }
  if (on(s.aniso)) {
    const at::Tensor k = gated(U(ad::kAnisoGate), s.aniso * p, torch::exp2(Z(ad::kAniso) * C::kAnisoStd), 1);
    g = g.bmm(m.scale2d(k.reciprocal(), k));
  }
  if (on(s.rotate)) {
    const at::Tensor t = gated(U(ad::kRotatePostGate), p_rot, (U(ad::kRotatePostAngle) * 2 - 1) * (M_PI * C::kRotateMax), 0);
    g = g.bmm(m.rotate2d(t));
  }
  if (on(s.xfrac)) {
    const at::Tensor gate = U(ad::kXfracGate);
    const at::Tensor tx = gated(gate, s.xfrac * p, Z(ad::kXfracX) * C::kXfracStd, 0);
    const at::Tensor ty = gated(gate, s.xfrac * p, Z(ad::kXfracY) * C::kXfracStd, 0);
    g = g.bmm(m.translate2d(-tx * width, -ty * height));
  }
  r.geometric = g;
  r.geometric_identity = torch::equal(g, torch::eye(3, torch::kDouble).expand({n, 3, 3}));
  // Colour: composed on the left, in the paper's order.
  at::Tensor c = torch::eye(4, torch::kDouble).expand({n, 4, 4}).contiguous();
  if (on(s.brightness)) {
    c = m.translate3d(gated(U(ad::kBrightnessGate), s.brightness * p, Z(ad::kBrightness) * C::kBrightnessStd, 0)).bmm(c);
  }
  if (on(s.contrast)) {
    c = m.scale3d(gated(U(ad::kContrastGate), s.contrast * p, torch::exp2(Z(ad::kContrast) * C::kContrastStd), 1)).bmm(c);
  }
  // The luma axis v = (1, 1, 1, 0) / sqrt(3); v v^T as a 4x4 matrix.
  const at::Tensor v = torch::tensor({1.0, 1.0, 1.0, 0.0}, torch::kDouble) / std::sqrt(3.0);
  const at::Tensor vv = torch::outer(v, v);
  const at::Tensor eye4 = torch::eye(4, torch::kDouble);
  if (on(s.lumaflip)) {
    const at::Tensor i = gated(U(ad::kLumaflipGate), s.lumaflip * p, torch::floor(U(ad::kLumaflipSide) * 2), 0);
    c = (eye4 - 2 * vv * i.view({n, 1, 1})).bmm(c);  // Householder reflection
  }
  if (on(s.hue) && channels > 1) {
    c = m.rotate_luma(gated(U(ad::kHueGate), s.hue * p, (U(ad::kHueAngle) * 2 - 1) * (M_PI * C::kHueMax), 0)).bmm(c);
  }
  if (on(s.saturation) && channels > 1) {
    const at::Tensor k =
        gated(U(ad::kSaturationGate), s.saturation * p, torch::exp2(Z(ad::kSaturation) * C::kSaturationStd), 1);
    c = (vv + (eye4 - vv) * k.view({n, 1, 1})).bmm(c);
  }
  r.color = c;
  r.color_identity = torch::equal(c, eye4.expand({n, 4, 4}));
  return r;
}

at::Tensor augment_images(const at::Tensor& x, const AugmentMatrices& m) {
  if (x.dim() != 4) throw std::invalid_argument("augment_images: images must be [N, C, H, W]");
  const int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  if (m.geometric.size(0) != n || m.color.size(0) != n) {
    throw std::invalid_argument("augment_images: " + std::to_string(n) + " images, " +
                                std::to_string(m.geometric.size(0)) + " transforms");
  }
  // 16-bit images resample and recolour in float32 (the CPU's grid sampler has no 16-bit
  // kernel), and go back to their dtype.
  const at::ScalarType dt = x.scalar_type();
  const bool narrow = dt == at::kBFloat16 || dt == at::kHalf;
  at::Tensor y = narrow ? x.to(at::kFloat) : x;
  if (!m.geometric_identity) {
    if (h < 2 || w < 2) throw std::invalid_argument("augment_images: geometric transforms need H and W >= 2");
    // Output pixel centres, from the image centre: i - (W - 1) / 2.
    const auto o = torch::TensorOptions().dtype(torch::kDouble);
    const at::Tensor xs = torch::arange(w, o) - (w - 1) / 2.0;
    const at::Tensor ys = torch::arange(h, o) - (h - 1) / 2.0;
    const std::vector<at::Tensor> mesh = torch::meshgrid({ys, xs}, "ij");
    const at::Tensor pts = torch::stack({mesh[1].flatten(), mesh[0].flatten(), torch::ones({h * w}, o)});  // [3, HW]
    const at::Tensor src = m.geometric.matmul(pts);                                                        // [N, 3, HW]
    // The input position in grid_sample's coordinates with align_corners: -1 and 1 are the
    // border pixels' centres, about which the reflection padding mirrors.
    const at::Tensor grid =
        torch::stack({src.select(1, 0) * (2.0 / (w - 1)), src.select(1, 1) * (2.0 / (h - 1))}, -1)
            .reshape({n, h, w, 2})
            .to(x.device(), y.scalar_type());
    y = at::grid_sampler(y, grid, /*bilinear*/ 0, /*reflection*/ 2, /*align_corners=*/true);
  }
  if (!m.color_identity) {
    const at::Tensor c = m.color.to(x.device(), y.scalar_type());
    at::Tensor flat = y.reshape({n, ch, h * w});
    if (ch == 3) {
      flat = c.narrow(1, 0, 3).narrow(2, 0, 3).matmul(flat) + c.narrow(1, 0, 3).narrow(2, 3, 1);
    } else if (ch == 1) {
      // One channel: the colour map's three rows averaged (luma in, luma out).
      const at::Tensor c1 = c.narrow(1, 0, 3).mean(1, true);  // [N, 1, 4]
      flat = flat * c1.narrow(2, 0, 3).sum(2, true) + c1.narrow(2, 3, 1);
    } else {
      throw std::invalid_argument("augment_images: colour transforms need 1 or 3 channels, not " + std::to_string(ch));
    }
    y = flat.reshape({n, ch, h, w});
  }
  return narrow ? y.to(dt) : y;
}

}  // namespace shardgan
