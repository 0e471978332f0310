#pragma once
/// Typed, validated reads of dotted config keys ("train.steps", "model.g_ch_mult"). The
/// trainer's config parser and each model family read their keys through one Reader, which
/// remembers every key it was asked for, so that a key nobody read is an error.
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardgan {

/// A bad config: the message names the file and the key, and says what is accepted.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigReader {
 public:
  /// `values`: flattened key -> YAML text of the value (a scalar, or a flow sequence such as
  /// "[4, 4, 2]"). `source` names the file in messages.
  ConfigReader(std::map<std::string, std::string> values, std::string source);

  /// The value of `key` as T, or `fallback` when the key is absent. T is bool, int,
  /// int64_t, uint64_t, double, std::string or std::vector<int64_t>. Throws ConfigError
  /// naming the file and key when the value does not parse as T.
  template <typename T>
  T get(const std::string& key, T fallback);

  /// Throws ConfigError naming the file and `key` with "`key` `what`" unless `ok`.
  void require(bool ok, const std::string& key, const std::string& what) const;

  /// Whether the config sets `key` (does not mark it as known).
  bool has(const std::string& key) const { return values_.count(key) != 0; }

  /// Throws ConfigError for the first key that no get() asked for, listing the known keys.
  void check_all_known() const;

  const std::string& source() const { return source_; }
  /// Every key read so far with its final value, one "key: value" line each; doubles are
  /// written with 17 significant digits, so that they read back exactly.
  std::string resolved() const { return resolved_.str(); }

 private:
  std::map<std::string, std::string> values_;
  std::string source_;
  std::set<std::string> known_;
  std::ostringstream resolved_;
};

}  // namespace shardgan
