#include "shardgan/util/config_reader.h"

#include <cmath>
#include <iomanip>
#include <limits>
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
  else return "string";
}

template <typename T>
std::string to_text(const T& v) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    s << "[";
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
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
T ConfigReader::get(const std::string& key, T fallback) {
  known_.insert(key);
  auto it = values_.find(key);
  T v = fallback;
  if (it != values_.end()) {
    try {
      v = YAML::Load(it->second).as<T>();
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
  resolved_ << key << ": " << to_text(v) << "\n";
  return v;
}

template bool ConfigReader::get<bool>(const std::string&, bool);
template int ConfigReader::get<int>(const std::string&, int);
template int64_t ConfigReader::get<int64_t>(const std::string&, int64_t);
template uint64_t ConfigReader::get<uint64_t>(const std::string&, uint64_t);
template double ConfigReader::get<double>(const std::string&, double);
template std::string ConfigReader::get<std::string>(const std::string&, std::string);
template std::vector<int64_t> ConfigReader::get<std::vector<int64_t>>(const std::string&, std::vector<int64_t>);

void ConfigReader::require(bool ok, const std::string& key, const std::string& what) const {
  if (!ok) throw ConfigError(source_ + ": key '" + key + "' " + what);
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
    std::string list;
    for (auto& k : known_) list += "\n  " + k;
    throw ConfigError(source_ + ": unknown config key '" + kv.first +
                      "'. Fix or remove it; known keys are:" + list);
  }
}

}  // namespace shardgan
