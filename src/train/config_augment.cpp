// The augment section of the training configuration (config_sections.h): ADA's keys
// (augment.h) and their rules against the update rule, the placement and the images.
#include <cmath>
#include <stdexcept>
#include <string>

#include "shardgan/models/family.h"
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_augment(Reader& r, TrainConfig& c) {
  AugmentConfig& a = c.augment;
  a.mode = r.get<std::string>("augment.mode", a.mode,
      "none, ada (every image D sees is augmented with probability p, which follows r_t = E[sign(D(real))] towards "
      "augment.target; Karras et al. 2020) or fixed (p stays augment.p)");
  require(a.mode == "none" || a.mode == "ada" || a.mode == "fixed", r, "augment.mode", "must be none, ada or fixed");
  a.pipe = r.get<std::string>("augment.pipe", a.pipe,
      "the transforms: blit (xflip, rotate90, integer translation), geom (scaling, rotation, anisotropic scaling, "
      "fractional translation), color (brightness, contrast, luma flip, hue, saturation), bg or bgc (all)");
  // The pipe's transforms come from AugmentStrengths::of_pipe, the one list of pipes.
  AugmentStrengths st;
  bool known_pipe = true;
  try {
    st = AugmentStrengths::of_pipe(a.pipe);
  } catch (const std::invalid_argument&) {
    known_pipe = false;
  }
  require(known_pipe, r, "augment.pipe", "must be blit, geom, color, bg or bgc");
  a.p = r.get<double>("augment.p", a.p, "the augmentation probability at the start (ada) or throughout (fixed)");
  require(a.p >= 0 && a.p <= 1, r, "augment.p", "must be in [0, 1]");
  a.target = r.get<double>("augment.target", a.target, "the r_t that ADA steers towards (the paper: 0.6)");
  require(a.target > -1 && a.target < 1, r, "augment.target", "must be in (-1, 1): r_t is a mean of signs");
  a.speed_kimg = r.get<double>("augment.speed_kimg", a.speed_kimg,
      "p can move from 0 to 1 within this many thousand real images (the authors' ada_kimg: 500)");
  require(a.speed_kimg > 0 && std::isfinite(a.speed_kimg), r, "augment.speed_kimg", "must be > 0");
  a.interval = r.get<int64_t>("augment.interval", a.interval, "steps between adjustments of p (the authors': 4)");
  require(a.interval >= 1, r, "augment.interval", "must be >= 1");
  for (const char* key : {"augment.pipe", "augment.p"}) {
    r.warn_if_ignored(!a.enabled(), key, "has no effect with augment.mode none");
  }
  for (const char* key : {"augment.target", "augment.speed_kimg", "augment.interval"}) {
    r.warn_if_ignored(!a.adaptive(), key, "has no effect unless augment.mode is ada (p does not move)");
  }
  // The rules hold for any mode but none (each is recorded for the config reference either way).
  const bool on = a.enabled();
  const std::string why = "with augment.mode ada or fixed (ADA) must be ";
  require(!on || c.placement == "shared", r, "train.placement", why + "shared");
  require(!on || c.update == "alternating", r, "train.update", why + "alternating");
  require(!on || !c.d_joint_pass, r, "train.d_joint_pass", why + "false (a D pass of its own per side)");
  require(!on || c.family->condition_channels() == 0, r, "model.arch",
          "with augment.mode ada or fixed (ADA) must be a model that generates from latents (an image-to-image "
          "model's D sees its input beside the image)");
  const ImageShape s = c.family->image_shape();
  const bool color = st.brightness > 0 || st.contrast > 0 || st.lumaflip > 0 || st.hue > 0 || st.saturation > 0;
  require(!on || !color || s.channels == 1 || s.channels == 3, r, "augment.pipe",
          "with colour transforms (color, bgc) needs 1 or 3 image channels");
  const bool geom = st.xflip > 0 || st.rotate90 > 0 || st.xint > 0 || st.scale > 0 || st.rotate > 0 ||
                    st.aniso > 0 || st.xfrac > 0;
  require(!on || !geom || (s.height >= 2 && s.width >= 2), r, "augment.pipe",
          "with geometric transforms needs images of at least 2x2 pixels");
}

}  // namespace shardgan::config_sections
