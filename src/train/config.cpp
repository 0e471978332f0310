// The training configuration's top level: a YAML file flattened to dotted keys, `--set`
// overrides on top, and the sections read in their fixed order (config_sections.h); each
// section's keys and rules live in src/train/config_<section>.cpp.
#include "shardgan/train/config.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "shardgan/train/config_sections.h"

namespace shardgan {
namespace {
using Flat = std::map<std::string, std::string>;

// A config has about 80 nodes. Aliases can make a small file a huge tree ("billion laughs":
// each level refers twice to the one before), which would take forever to walk.
constexpr size_t kMaxNodes = 10000;

void flatten(const YAML::Node& node, const std::string& prefix, Flat& out,
             const std::string& source, size_t& visited) {
  if (++visited > kMaxNodes) {
    throw ConfigError(source + ": more than " + std::to_string(kMaxNodes) + " keys and values (near key '" +
                      prefix + "'); are aliases expanding it?");
  }
  if (node.IsMap() && node.size() == 0 && !prefix.empty()) {
    // Kept, so that "key: {}" is a bad value of the key instead of silently meaning its
    // default; an empty section ("ema: {}") is allowed (ConfigReader::check_all_known).
    if (out.count(prefix)) throw ConfigError(source + ": key '" + prefix + "' is set twice; keep one");
    out[prefix] = "{}";
    return;
  }
  if (node.IsMap()) {
    std::set<std::string> keys;
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string key = it->first.as<std::string>();
      const std::string full = prefix.empty() ? key : prefix + "." + key;
      // yaml-cpp keeps both entries of a duplicate key, and the later one would silently win.
      if (!keys.insert(key).second) {
        throw ConfigError(source + ": key '" + full + "' appears twice in the same map; keep one");
      }
      flatten(it->second, full, out, source, visited);
    }
    return;
  }
  if (out.count(prefix)) {  // e.g. "train.steps: 1" beside "train: {steps: 2}"
    throw ConfigError(source + ": key '" + prefix + "' is set twice; keep one");
  }
  if (node.IsScalar()) {
    out[prefix] = node.Scalar();
  } else if (node.IsNull()) {
    out[prefix] = "";
  } else if (node.IsSequence()) {
    YAML::Emitter e;  // kept as YAML text; the reader parses it as a list
    e << YAML::Flow << node;
    out[prefix] = e.c_str();
  } else {
    throw ConfigError(source + ": key '" + prefix + "' must be a scalar, a list or a map");
  }
}

}  // namespace

namespace config_sections {

TrainConfig read_config(Reader& r, const std::string& source) {
  TrainConfig c;
  c.source = source;
  read_run(r, c);
  read_data(r, c);
  read_train_loop(r, c);
  read_model(r, c);
  read_train_update(r, c);  // and placement.*
  read_train_losses(r, c);
  read_train_regularization(r, c);
  read_train_guards(r, c);
  read_eval(r, c);
  read_train_plots(r, c);
  read_sharding(r, c);
  read_optim(r, c);
  read_offload(r, c);
  read_train_grad_clip(r, c);
  read_ema(r, c);
  read_augment(r, c);
  read_loss_scale(r, c);
  read_dist(r, c);
  check_sharding_quantized_backend(r, c);
  read_checkpoint(r, c);
  check_sharding_groups_backend(r, c);
  check_split(r, c);
  r.check_all_known();
  c.resolved_yaml = r.resolved();
  c.resolved_nested_yaml = r.resolved_nested_yaml();
  c.warnings = r.warnings();
  return c;
}

}  // namespace config_sections

namespace {

// Counts documents without building nodes.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The number of YAML documents in `text`, counting up to `limit`.
int count_documents(const std::string& text, int limit) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  int n = 0;
  while (n < limit && parser.HandleNextDocument(counter)) ++n;
  return n;
}

// The 1-based line of the first byte of `text` that is not part of valid UTF-8, or 0 when
// all of it is (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
size_t first_invalid_utf8_line(const std::string& text) {
  size_t line = 1;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') ++line;
    size_t n = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return line;
    }
    if (i + n >= text.size()) return line;  // cut off at the end
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return line;
    }
    i += n + 1;
  }
  return 0;
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides) {
  Flat flat;
  // yaml-cpp reads any bytes but prints invalid UTF-8 as U+FFFD, so --print-config would
  // not give back what was read (found by tests/fuzz/config_fuzz.cpp's round trip).
  if (const size_t line = first_invalid_utf8_line(yaml_text); line != 0) {
    throw ConfigError(source + ": line " + std::to_string(line) +
                      " is not valid UTF-8; YAML configs are UTF-8 text: save the file as UTF-8");
  }
  for (const auto& o : overrides) {
    if (first_invalid_utf8_line(o) != 0) {
      throw ConfigError("--set '" + o + "': not valid UTF-8; pass UTF-8 text");
    }
  }
  try {
    // YAML::Load would read the first document and silently drop any after a "---", so the
    // documents are counted first, by events only and at most 2 (YAML::LoadAll loops forever
    // on some inputs, e.g. the two bytes ", ": found by tests/fuzz/config_fuzz.cpp).
    if (count_documents(yaml_text, 2) > 1) {
      throw ConfigError(source + ": holds more than one YAML document (separated by ---); a config is one document");
    }
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsNull()) {
      if (!root.IsMap()) throw ConfigError(source + ": the top level must be a map of sections");
      size_t visited = 0;
      flatten(root, "", flat, source, visited);
    }
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": YAML error: " + e.what());
  }
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("--set '" + o + "': expected key=value, e.g. train.steps=200");
    }
    flat[o.substr(0, eq)] = o.substr(eq + 1);
  }
  ConfigReader r(flat, source);
  return config_sections::read_config(r, source);
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot open config file '" + path + "': check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

}  // namespace shardgan
