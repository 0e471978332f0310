#pragma once
/// Typed, validated reads of dotted config keys ("train.steps", "model.g_ch_mult"). The
/// trainer's config parser and each model family read their keys through one Reader, which
/// remembers every key it was asked for, so that a key nobody read is an error, and so that
/// the config reference (docs/config.md, `shardgan-train --config-reference`) is generated
/// from the reads themselves: key, type, default, rules and meaning.
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardgan {

/// A bad config: the message names the file and the key, and says what is accepted.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the reader learned about one key while reading it.
struct ConfigKeyInfo {
  std::string type;          ///< "integer", "number", "boolean (true/false)", "string", ...
  std::string default_text;  ///< the fallback get() was given, as YAML text
  std::string value_text;    ///< the value read (the config's, or the default), as YAML text
  bool is_string = false;    ///< the value is a string (quoted when written back as YAML)
  std::string meaning;       ///< one line, from get()'s `meaning`
  std::vector<std::string> rules;  ///< every require() text for this key, in order, once each
};

class ConfigReader {
 public:
  /// `values`: flattened key -> YAML text of the value (a scalar, or a flow sequence such as
  /// "[4, 4, 2]"). `source` names the file in messages.
  ConfigReader(std::map<std::string, std::string> values, std::string source);

  /// The value of `key` as T, or `fallback` when the key is absent. T is bool, int,
  /// int64_t, uint64_t, double, std::string, std::vector<int64_t> or std::vector<std::string>. `meaning` is the
  /// key's one-line description in the config reference. Throws ConfigError naming the
  /// file and key when the value does not parse as T.
  template <typename T>
  T get(const std::string& key, T fallback, const char* meaning = "");

  /// Throws ConfigError naming the file and `key` with "`key` `what`" unless `ok`. `what`
  /// is recorded as a rule of `key` for the config reference either way.
  void require(bool ok, const std::string& key, const std::string& what);

  /// Whether the config sets `key` (does not mark it as known).
  bool has(const std::string& key) const { return values_.count(key) != 0; }

  /// A key the resolved config ignores. When `ignored` and the config sets `key` explicitly
  /// (the file or --set) to a value other than its default, records one warning, once per
  /// key: "<source>: key '<key>' is set to <value> but <why>". A key left at its default, or
  /// set to it (as --print-config's output spells out every default), is never warned about.
  /// `why` ("has no effect with ...") is recorded as a rule of `key` for the config reference
  /// either way ("warns when set: <why>"). Call after get(key); throws nothing.
  void warn_if_ignored(bool ignored, const std::string& key, const std::string& why);

  /// The warnings warn_if_ignored recorded, in the order of the calls. The reader only
  /// collects them; the trainer logs them (on rank 0).
  const std::vector<std::string>& warnings() const { return warnings_; }

  /// Throws ConfigError for the first key that no get() asked for. The message suggests
  /// the nearest known key ("did you mean ...", by edit distance) and points at
  /// docs/config.md, instead of listing every key.
  void check_all_known() const;

  const std::string& source() const { return source_; }
  /// Every key read so far with its final value, one "key: value" line each (flat, dotted
  /// keys); doubles are written with 17 significant digits, so that they read back exactly.
  /// This is what checkpoints store.
  std::string resolved() const;
  /// The same keys and values as nested YAML ("train:\n  steps: 100"), sections in the
  /// order they were first read; parse_config() reads it back to the same config.
  std::string resolved_nested_yaml() const;
  /// Every key read so far, in the order of the first read.
  const std::vector<std::string>& read_order() const { return order_; }
  /// What was learned about each key read so far.
  const std::map<std::string, ConfigKeyInfo>& keys() const { return info_; }

 private:
  std::map<std::string, std::string> values_;
  std::string source_;
  std::set<std::string> known_;
  std::vector<std::string> order_;
  std::map<std::string, ConfigKeyInfo> info_;
  std::vector<std::string> warnings_;
  std::set<std::string> warned_;  // keys with a warning already
};

/// Levenshtein distance between `a` and `b` (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace shardgan
