#include "shardgan/util/config_reader.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <type_traits>

#include <yaml-cpp/yaml.h>

namespace shardgan {
namespace {

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "boolean (true/false)";
  else if constexpr (std::is_integral_v<T>) return "integer";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of integers, e.g. [4, 4, 2]";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "list of strings, e.g. [\"a.*\", \"b\"]";
  else return "string";
}

template <typename T>
std::string to_text(const T& v) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    s << "[";
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
    s << "]";
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    s << "[";  // quoted: a glob may start with '*', YAML's alias mark
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << std::quoted(v[i]);
    s << "]";
  } else if constexpr (std::is_floating_point_v<T>) {
    s << std::setprecision(std::numeric_limits<double>::max_digits10) << v;  // reads back exactly
  } else {
    s << std::boolalpha << v;
  }
  return s.str();
}

}  // namespace

ConfigReader::ConfigReader(std::map<std::string, std::string> values, std::string source)
    : values_(std::move(values)), source_(std::move(source)) {}

template <typename T>
T ConfigReader::get(const std::string& key, T fallback, const char* meaning) {
  known_.insert(key);
  ConfigKeyInfo& info = info_[key];  // require() may have made the entry already
  if (info.type.empty()) {  // the first read
    order_.push_back(key);
    info.type = type_name<T>();
    info.default_text = to_text(fallback);
    info.is_string = std::is_same_v<T, std::string>;
  }
  if (info.meaning.empty() && meaning) info.meaning = meaning;
  auto it = values_.find(key);
  T v = fallback;
  if (it != values_.end()) {
    try {
      if constexpr (std::is_same_v<T, std::string>) {
        // An empty value ("path:" or "path: ''"): the empty string, not YAML's null.
        v = it->second.empty() ? std::string() : YAML::Load(it->second).as<T>();
      } else {
        v = YAML::Load(it->second).as<T>();
      }
    } catch (const YAML::Exception&) {
      throw ConfigError(source_ + ": key '" + key + "' has value '" + it->second +
                        "', which is not a valid " + type_name<T>());
    }
    if constexpr (std::is_floating_point_v<T>) {  // yaml-cpp reads .inf and .nan
      if (!std::isfinite(v)) {
        throw ConfigError(source_ + ": key '" + key + "' has value '" + it->second + "', which is not a finite number");
      }
    }
  }
  info.value_text = to_text(v);
  return v;
}

template bool ConfigReader::get<bool>(const std::string&, bool, const char*);
template int ConfigReader::get<int>(const std::string&, int, const char*);
template int64_t ConfigReader::get<int64_t>(const std::string&, int64_t, const char*);
template uint64_t ConfigReader::get<uint64_t>(const std::string&, uint64_t, const char*);
template double ConfigReader::get<double>(const std::string&, double, const char*);
template std::string ConfigReader::get<std::string>(const std::string&, std::string, const char*);
template std::vector<int64_t> ConfigReader::get<std::vector<int64_t>>(const std::string&, std::vector<int64_t>, const char*);
template std::vector<std::string> ConfigReader::get<std::vector<std::string>>(const std::string&,
                                                                               std::vector<std::string>, const char*);

void ConfigReader::require(bool ok, const std::string& key, const std::string& what) {
  auto& rules = info_[key].rules;
  if (std::find(rules.begin(), rules.end(), what) == rules.end()) rules.push_back(what);
  if (!ok) throw ConfigError(source_ + ": key '" + key + "' " + what);
}

void ConfigReader::warn_if_ignored(bool ignored, const std::string& key, const std::string& why) {
  ConfigKeyInfo& info = info_[key];
  const std::string rule = "warns when set: " + why;
  if (std::find(info.rules.begin(), info.rules.end(), rule) == info.rules.end()) info.rules.push_back(rule);
  if (!ignored || !has(key) || info.value_text == info.default_text || !warned_.insert(key).second) return;
  warnings_.push_back(source_ + ": key '" + key + "' is set to " + info.value_text + " but " + why);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string ConfigReader::resolved() const {
  std::string out;
  for (const std::string& key : order_) out += key + ": " + info_.at(key).value_text + "\n";
  return out;
}

std::string ConfigReader::resolved_nested_yaml() const {
  YAML::Node root(YAML::NodeType::Map);
  for (const std::string& key : order_) {
    const ConfigKeyInfo& k = info_.at(key);
    // Walk (creating) the sections of "a.b.c"; yaml-cpp keeps the insertion order.
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t dot = key.find('.', start);
      parts.push_back(key.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    std::vector<YAML::Node> path{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) path.push_back(path.back()[parts[i]]);
    if (k.is_string) {
      path.back()[parts.back()] = k.value_text;  // the emitter quotes it where YAML needs that
    } else {
      path.back()[parts.back()] = YAML::Load(k.value_text);
    }
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

void ConfigReader::check_all_known() const {
  for (auto& kv : values_) {
    if (known_.count(kv.first)) continue;
    if (kv.second == "{}") {  // an empty section ("ema: {}"): fine if keys under it exist
      auto it = known_.lower_bound(kv.first + ".");
      if (it != known_.end() && it->rfind(kv.first + ".", 0) == 0) continue;
    }
    // "train.steps.a" from "train: {steps: {a: 1}}": a map where one value belongs.
    for (size_t dot = kv.first.rfind('.'); dot != std::string::npos && dot > 0;
         dot = kv.first.rfind('.', dot - 1)) {
      const std::string parent = kv.first.substr(0, dot);
      if (known_.count(parent)) {
        throw ConfigError(source_ + ": key '" + parent + "' takes one value, not a map (it has key '" +
                          kv.first + "' under it)");
      }
    }
    // The nearest known key by edit distance, when it is near enough to be a typo.
    std::string best;
    size_t best_d = std::string::npos;
    for (auto& k : known_) {
      const size_t d = edit_distance(kv.first, k);
      if (d < best_d) best_d = d, best = k;
    }
    const size_t limit = std::max<size_t>(2, kv.first.size() / 4);
    std::string hint = best_d <= limit ? " Did you mean '" + best + "'?" : "";
    if (hint.empty()) {  // a wrong section ("optim.g.lr"): the keys with the same last name
      const std::string leaf = kv.first.substr(kv.first.rfind('.') + 1);
      std::string same;
      for (auto& k : known_) {
        if (k.size() > leaf.size() && k.compare(k.size() - leaf.size() - 1, std::string::npos, "." + leaf) == 0) {
          same += (same.empty() ? "'" : ", '") + k + "'";
        }
      }
      if (!same.empty()) hint = " Did you mean " + same + "?";
    }
    throw ConfigError(source_ + ": unknown config key '" + kv.first + "'." + hint +
                      " Fix or remove it; docs/config.md lists every key, and `shardgan-train --print-config "
                      "CONFIG` prints the resolved config.");
  }
}

}  // namespace shardgan
