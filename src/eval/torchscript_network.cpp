// A TorchScript module with a shardgan manifest as a feature network (feature_network.h).
#include "eval/torchscript_network.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/script.h>
#include <torch/torch.h>

#include "eval/network_hash.h"

namespace shardgan::eval {
namespace {

constexpr const char* kRemedy =
    "; make one with scripts/export_inception.py (docs/fid.md), or use eval.features: classifier";

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

class TorchScriptNetwork final : public FeatureNetwork {
 public:
  explicit TorchScriptNetwork(const std::string& path) : path_(path) {
    if (!std::filesystem::is_regular_file(path)) throw error("no such file");
    torch::jit::ExtraFilesMap extra{{kFeatureManifestName, ""}};
    try {
      module_ = torch::jit::load(path, torch::kCPU, extra);
    } catch (const c10::Error& e) {
      throw error("not a TorchScript archive that torch::jit::load can read (" + first_line(e.what_without_backtrace()) +
                  ")");
    }
    const std::string text = extra[kFeatureManifestName];
    interface_ = text.empty() ? detector_interface() : Interface::kManifest;
    detector_ = interface_ == Interface::kInception || interface_ == Interface::kVgg16;
    if (text.empty() && !detector_) {
      throw error(std::string("holds no manifest (") + kFeatureManifestName +
                  ", saved by torch.jit.save's _extra_files), and its forward has neither of StyleGAN2-ADA's detector "
                  "interfaces (Inception: img, return_features, use_fp16, no_output_bias; VGG16: img, resize_images, "
                  "return_lpips, return_features), so its input contract is unknown");
    }
    if (!detector_) read_manifest(text);
    module_.eval();
    std::map<std::string, at::Tensor> weights;
    for (const auto& p : module_.named_parameters(true)) {
      if (p.value.scalar_type() != at::kFloat) throw error("parameter " + p.name + " is not float32");
      weights[p.name] = p.value;
    }
    for (const auto& b : module_.named_buffers(true)) weights[b.name] = b.value;
    hash_ = weights_xxh3(weights);
    if (detector_) {
      set_up_detector();
    } else if (hash_ != manifest_hash_) {
      throw error("the manifest's weights_xxh3 " + manifest_hash_ + " differs from the module's weights (" + hash_ +
                  "): the manifest belongs to another file, or the weights were changed after export");
    }
    probe();
  }

  std::string kind() const override { return "torchscript"; }
  const std::string& path() const override { return path_; }
  std::string description() const override { return description_; }
  std::string hash() const override { return hash_; }
  bool comparable_with_papers() const override { return comparable_ == "pytorch-fid"; }
  int64_t feature_dim() const override { return features_; }
  int64_t num_logits() const override { return logits_; }
  const InputContract& input() const override { return input_; }

 protected:
  FeatureBatch forward(const at::Tensor& x) override {
    torch::NoGradGuard no_grad;
    if (detector_) return forward_detector(x);
    c10::IValue out;
    try {
      out = module_.forward({x});
    } catch (const c10::Error& e) {
      throw error("the module fails on images of " + shape_of(x) + ": " + first_line(e.what_without_backtrace()));
    }
    FeatureBatch b;
    if (out.isTuple()) {
      const auto& el = out.toTupleRef().elements();
      if (el.empty() || !el[0].isTensor()) throw error("the module's output tuple does not start with a tensor");
      b.features = el[0].toTensor();
      if (el.size() > 1 && el[1].isTensor()) b.logits = el[1].toTensor();
    } else if (out.isTensor()) {
      b.features = out.toTensor();
    } else {
      throw error("the module returns neither a tensor nor a tuple of tensors");
    }
    const int64_t n = x.size(0);
    b.features = b.features.reshape({b.features.size(0), -1});
    if (b.features.size(0) != n || b.features.size(1) != features_) {
      throw error("the module returns features of " + shape_of(b.features) + " for " + std::to_string(n) +
                  " images, but its manifest says outputs.features " + std::to_string(features_));
    }
    b.features = b.features.to(torch::kDouble);
    if (logits_ > 0) {
      if (!b.logits.defined() || b.logits.dim() != 2 || b.logits.size(0) != n || b.logits.size(1) != logits_) {
        throw error("the module returns " + (b.logits.defined() ? "logits of " + shape_of(b.logits) : "no logits") +
                    ", but its manifest says outputs.logits " + std::to_string(logits_));
      }
      b.logits = b.logits.to(torch::kDouble);
    } else {
      b.logits = at::Tensor();
    }
    return b;
  }

 private:
  FeatureNetworkError error(const std::string& what) const {
    const std::string during = probing_ ? std::string(" (at load, on one zero image of ") +
                                              (detector_ ? "" : "its manifest's input.size ") +
                                              std::to_string(input_.channels) + "x" + std::to_string(input_.height) +
                                              "x" + std::to_string(input_.width) + ")" : "";
    return FeatureNetworkError("feature network " + path_ + ": " + what + during + kRemedy);
  }

  static std::string shape_of(const at::Tensor& t) {
    std::string s = "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
    return s + "]";
  }

  void read_manifest(const std::string& text) {
    nlohmann::json m;
    try {
      m = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw error(std::string("its manifest is not JSON (") + e.what() + ")");
    }
    auto need = [&](const nlohmann::json& obj, const char* key, const char* where) -> const nlohmann::json& {
      if (!obj.is_object() || !obj.contains(key)) throw error(std::string("its manifest lacks ") + where + key);
      return obj.at(key);
    };
    try {
      if (need(m, "format", "").get<std::string>() != kFeatureManifestFormat) {
        throw error(std::string("its manifest's format is not ") + kFeatureManifestFormat);
      }
      if (need(m, "version", "").get<int64_t>() != kFeatureManifestVersion) {
        throw error("its manifest has version " + m.at("version").dump() + "; this shardgan reads version " +
                    std::to_string(kFeatureManifestVersion));
      }
      description_ = need(m, "architecture", "").get<std::string>() + ", " + need(m, "weights", "").get<std::string>();
      manifest_hash_ = need(m, "weights_xxh3", "").get<std::string>();
      comparable_ = m.value("comparable", std::string());
      const nlohmann::json& in = need(m, "input", "");
      const nlohmann::json& range = need(in, "range", "input.");
      const nlohmann::json& size = need(in, "size", "input.");
      if (!range.is_array() || range.size() != 2 || !size.is_array() || size.size() != 2) {
        throw error("its manifest's input.range and input.size must be pairs");
      }
      input_.range_min = range[0].get<double>();
      input_.range_max = range[1].get<double>();
      input_.channels = need(in, "channels", "input.").get<int64_t>();
      input_.height = size[0].get<int64_t>();
      input_.width = size[1].get<int64_t>();
      input_.resize = need(in, "resize", "input.").get<std::string>();
      const nlohmann::json& outs = need(m, "outputs", "");
      features_ = need(outs, "features", "outputs.").get<int64_t>();
      logits_ = need(outs, "logits", "outputs.").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw error(std::string("its manifest has a value of the wrong type (") + e.what() + ")");
    }
    if (!(input_.range_max > input_.range_min)) throw error("its manifest's input.range must be increasing");
    if (input_.channels != 1 && input_.channels != 3) throw error("its manifest's input.channels must be 1 or 3");
    if (input_.height < 1 || input_.width < 1) throw error("its manifest's input.size must be positive");
    if (input_.resize != "none" && input_.resize != "bilinear") {
      throw error("its manifest's input.resize must be none or bilinear, got '" + input_.resize + "'");
    }
    if (features_ < 1 || logits_ < 0) throw error("its manifest's outputs.features must be >= 1 and logits >= 0");
  }

  // StyleGAN2-ADA's detectors (feature_network.h), told apart by their forward's arguments:
  //  - forward(img, return_features, use_fp16, no_output_bias), as NVIDIA's
  //    inception-2015-12-05.pt has it;
  //  - forward(img, ...) with resize_images, return_lpips and return_features among the
  //    others, as NVIDIA's vgg16.pt has it (metrics/precision_recall.py calls it with
  //    return_features=True, metrics/perceptual_path_length.py with resize_images=False,
  //    return_lpips=True).
  enum class Interface { kManifest, kNone, kInception, kVgg16 };
  Interface detector_interface() const {
    const auto method = module_.find_method("forward");
    if (!method) return Interface::kNone;
    std::vector<std::string> names;
    for (const auto& a : method->function().getSchema().arguments()) names.push_back(a.name());
    const std::vector<std::string> inception = {"self", "img", "return_features", "use_fp16", "no_output_bias"};
    if (names == inception) return Interface::kInception;
    auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    if (names.size() >= 2 && names[1] == "img" && has("resize_images") && has("return_lpips") && has("return_features")) {
      return Interface::kVgg16;
    }
    return Interface::kNone;
  }

  // The detector's contract is fixed by how StyleGAN2-ADA calls it (metric_utils.py): uint8
  // pixels, 3 channels, at their own size (the module resizes them). Inception's logits'
  // weights are its output layer's; VGG16 gives features only. The feature width comes from
  // the probe.
  void set_up_detector() {
    input_.range_min = 0.0;
    input_.range_max = 255.0;
    input_.channels = 3;
    input_.height = input_.width = 64;  // the probe's size; any size goes in
    input_.resize = "module";
    input_.quantize = "uint8";
    features_ = -1;  // set by the probe
    if (interface_ == Interface::kVgg16) {
      description_ = "StyleGAN2-ADA VGG16 interface (NVIDIA's vgg16.pt, the features of pr50k3), weights xxh3 " + hash_;
      return;
    }
    for (const auto& child : module_.named_children()) {
      if (child.name != "output" || !child.value.hasattr("weight") || !child.value.attr("weight").isTensor()) continue;
      output_weight_ = child.value.attr("weight").toTensor().detach().to(torch::kDouble);
      if (output_weight_.dim() != 2) throw error("its output.weight is not a matrix");
      logits_ = output_weight_.size(0);
    }
    description_ = "StyleGAN2-ADA detector interface (NVIDIA's inception-2015-12-05.pt), weights xxh3 " + hash_;
  }

  FeatureBatch forward_detector(const at::Tensor& x) {
    c10::IValue out;
    try {
      out = interface_ == Interface::kVgg16
                ? module_.forward({x}, {{"return_features", true}})  // resize_images keeps its default, true
                : module_.forward({x, /*return_features=*/true, /*use_fp16=*/false, /*no_output_bias=*/false});
    } catch (const c10::Error& e) {
      throw error("the module fails on uint8 images of " + shape_of(x) + " with return_features=True: " +
                  first_line(e.what_without_backtrace()));
    }
    if (!out.isTensor() || out.toTensor().dim() != 2 || out.toTensor().size(0) != x.size(0)) {
      throw error("the module's forward(img, return_features=True) does not return features [B, F] for " +
                  shape_of(x));
    }
    FeatureBatch b;
    b.features = out.toTensor().to(torch::kDouble);
    if (features_ < 0) features_ = b.features.size(1);
    if (b.features.size(1) != features_) {
      throw error("the module returns features of " + shape_of(b.features) + ", not of width " +
                  std::to_string(features_));
    }
    if (logits_ > 0) {
      if (output_weight_.size(1) != features_) {
        throw error("its output.weight is " + shape_of(output_weight_) + ", which does not take features of width " +
                    std::to_string(features_));
      }
      b.logits = b.features.mm(output_weight_.t());
    }
    return b;
  }

  // One image of the contract's shape, so that a wrong size or output width is refused at
  // load time, naming the file, rather than at the first evaluation.
  void probe() {
    probing_ = true;
    forward(torch::zeros({1, input_.channels, input_.height, input_.width},
                         input_.quantize == "uint8" ? torch::kByte : torch::kFloat));
    probing_ = false;
  }

  std::string path_, description_, hash_, manifest_hash_, comparable_;
  torch::jit::Module module_;
  InputContract input_;
  int64_t features_ = 0, logits_ = 0;
  bool probing_ = false;
  bool detector_ = false;    // one of StyleGAN2-ADA's detector interfaces, no manifest
  Interface interface_ = Interface::kManifest;
  at::Tensor output_weight_;  // the detector's output.weight [K, F], float64
};

}  // namespace

std::unique_ptr<FeatureNetwork> load_torchscript_network(const std::string& path) {
  return std::make_unique<TorchScriptNetwork>(path);
}

}  // namespace shardgan::eval
