#include "shardgan/checkpoint/manifest.h"

#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace shardgan::ckpt {
namespace {

using nlohmann::json;

std::string hex(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t unhex(const std::string& s) {
  size_t used = 0;
  const uint64_t v = std::stoull(s, &used, 16);
  if (used != s.size() || s.size() != 16) throw std::runtime_error("bad checksum '" + s + "'");
  return v;
}

}  // namespace

const ModelEntry* Manifest::model(const std::string& name) const {
  for (const auto& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const FileEntry& Manifest::file(int rank) const {
  for (const auto& f : files) {
    if (f.rank == rank) return f;
  }
  throw std::out_of_range("the index lists no file for rank " + std::to_string(rank));
}

std::string to_json(const Manifest& m) {
  json j;
  j["format"] = kFormatName;
  j["schema_version"] = m.schema_version;
  j["world_size"] = m.world_size;
  j["step"] = m.step;
  j["epoch"] = m.epoch;
  j["batch_in_epoch"] = m.batch_in_epoch;
  j["scalars"] = m.scalars;
  j["config"] = m.config;
  j["block_bytes"] = m.block_bytes;
  j["models"] = json::array();
  for (const auto& mo : m.models) {
    json jm = {{"name", mo.name},           {"stage", mo.stage},
               {"dtype", mo.dtype},         {"optim_step", mo.optim_step},
               {"optim_states", mo.optim_states}, {"extras", mo.extras}};
    if (!mo.raw_states.empty()) {  // absent otherwise: older readers see the same manifest
      jm["raw_states"] = mo.raw_states;
      jm["raw_state_maps"] = mo.raw_state_maps;
      jm["raw_state_block"] = mo.raw_state_block;
    }
    jm["units"] = json::array();
    for (const auto& u : mo.units) {
      json ju = {{"name", u.name}, {"numel", u.numel}, {"padded_numel", u.padded_numel}};
      ju["params"] = json::array();
      for (const auto& p : u.params) {
        ju["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
      }
      ju["shards"] = json::array();
      for (const auto& s : u.shards) {
        ju["shards"].push_back({{"rank", s.rank}, {"offset", s.offset}, {"numel", s.numel}});
      }
      jm["units"].push_back(ju);
    }
    jm["buffers"] = json::array();
    for (const auto& b : mo.buffers) {
      jm["buffers"].push_back({{"name", b.name}, {"shape", b.shape}, {"dtype", b.dtype}, {"rank", b.rank}});
    }
    j["models"].push_back(jm);
  }
  j["files"] = json::array();
  for (const auto& f : m.files) {
    json jf = {{"rank", f.rank}, {"name", f.name}, {"bytes", f.bytes}};
    json jd = json::object();
    for (const auto& [path, d] : f.datasets) {
      json h = json::array();
      for (uint64_t v : d.xxh3) h.push_back(hex(v));
      jd[path] = {{"dtype", d.dtype}, {"numel", d.numel}, {"xxh3", h}};
    }
    jf["datasets"] = jd;
    j["files"].push_back(jf);
  }
  return j.dump(1);
}

Manifest manifest_from_json(const std::string& text, const std::string& where) {
  try {
    json j = json::parse(text);
    if (j.at("format").get<std::string>() != kFormatName) throw std::runtime_error("not a shardgan checkpoint index");
    Manifest m;
    m.schema_version = j.at("schema_version").get<int64_t>();
    m.world_size = j.at("world_size").get<int64_t>();
    m.step = j.at("step").get<int64_t>();
    m.epoch = j.at("epoch").get<int64_t>();
    m.batch_in_epoch = j.at("batch_in_epoch").get<int64_t>();
    m.scalars = j.at("scalars").get<std::map<std::string, double>>();
    m.config = j.at("config").get<std::string>();
    m.block_bytes = j.at("block_bytes").get<int64_t>();
    if (m.block_bytes <= 0 || m.block_bytes % 8 != 0) throw std::runtime_error("bad block_bytes");
    for (const auto& jm : j.at("models")) {
      ModelEntry mo;
      mo.name = jm.at("name").get<std::string>();
      mo.stage = jm.at("stage").get<int>();
      mo.dtype = jm.at("dtype").get<std::string>();
      mo.optim_step = jm.at("optim_step").get<int64_t>();
      mo.optim_states = jm.at("optim_states").get<std::vector<std::string>>();
      mo.extras = jm.at("extras").get<std::vector<std::string>>();
      if (jm.contains("raw_states")) {
        mo.raw_states = jm.at("raw_states").get<std::vector<std::string>>();
        mo.raw_state_maps = jm.at("raw_state_maps").get<std::vector<std::string>>();
        mo.raw_state_block = jm.at("raw_state_block").get<int64_t>();
        if (mo.raw_state_block < 1) throw std::runtime_error("bad raw_state_block");
        if (mo.raw_state_maps.size() != mo.raw_states.size()) throw std::runtime_error("bad raw_state_maps");
        for (const auto& mp : mo.raw_state_maps) {
          if (mp != "signed" && mp != "unsigned") throw std::runtime_error("bad raw_state_maps");
        }
      }
      for (const auto& ju : jm.at("units")) {
        UnitEntry u;
        u.name = ju.at("name").get<std::string>();
        u.numel = ju.at("numel").get<int64_t>();
        u.padded_numel = ju.at("padded_numel").get<int64_t>();
        for (const auto& jp : ju.at("params")) {
          u.params.push_back({jp.at("name").get<std::string>(), jp.at("shape").get<std::vector<int64_t>>(),
                              jp.at("offset").get<int64_t>(), jp.at("numel").get<int64_t>()});
        }
        for (const auto& js : ju.at("shards")) {
          u.shards.push_back({js.at("rank").get<int>(), js.at("offset").get<int64_t>(), js.at("numel").get<int64_t>()});
        }
        mo.units.push_back(std::move(u));
      }
      for (const auto& jb : jm.at("buffers")) {
        mo.buffers.push_back({jb.at("name").get<std::string>(), jb.at("shape").get<std::vector<int64_t>>(),
                              jb.at("dtype").get<std::string>(), jb.at("rank").get<int>()});
      }
      m.models.push_back(std::move(mo));
    }
    for (const auto& jf : j.at("files")) {
      FileEntry f;
      f.rank = jf.at("rank").get<int>();
      f.name = jf.at("name").get<std::string>();
      f.bytes = jf.at("bytes").get<int64_t>();
      for (const auto& [path, jd] : jf.at("datasets").items()) {
        DatasetEntry d;
        d.dtype = jd.at("dtype").get<std::string>();
        d.numel = jd.at("numel").get<int64_t>();
        for (const auto& h : jd.at("xxh3")) d.xxh3.push_back(unhex(h.get<std::string>()));
        f.datasets[path] = std::move(d);
      }
      m.files.push_back(std::move(f));
    }
    return m;
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": malformed checkpoint manifest (" + e.what() + ")");
  }
}

std::string unit_dataset(const std::string& model, const std::string& unit, const std::string& kind) {
  return model + "/units/" + unit + "/" + kind;
}

std::string index_path(const std::string& model, const std::string& kind, const std::string& qualified) {
  const std::string k = kind == "param_shard" ? "params" : kind;
  return model + "/" + k + "/" + qualified;
}

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.h5", rank);
  return name;
}

std::string raw_state_dataset(const std::string& model, const std::string& unit, const std::string& state,
                              const std::string& param, const std::string& part) {
  return unit_dataset(model, unit, "optim_raw/" + state + "/" + param + "." + part);
}

std::vector<std::string> state_kinds(const ModelEntry& mo) {
  std::vector<std::string> k = {"param_shard"};
  for (const auto& s : mo.optim_states) k.push_back("optim/" + s);
  for (const auto& e : mo.extras) k.push_back(e);
  return k;
}

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t lo, int64_t hi) {
  std::vector<Box> out;
  if (hi <= lo) return out;
  if (shape.empty()) {  // a 0-d tensor has one element
    out.push_back({{}, {}});
    return out;
  }
  if (shape.size() == 1) {
    out.push_back({{lo}, {hi - lo}});
    return out;
  }
  const std::vector<int64_t> inner_shape(shape.begin() + 1, shape.end());
  int64_t inner = 1;
  for (int64_t d : inner_shape) inner *= d;
  auto prefixed = [&](int64_t row, int64_t a, int64_t b) {
    for (Box& bx : flat_range_boxes(inner_shape, a, b)) {
      bx.start.insert(bx.start.begin(), row);
      bx.count.insert(bx.count.begin(), 1);
      out.push_back(std::move(bx));
    }
  };
  int64_t r0 = lo / inner;
  const int64_t r1 = (hi - 1) / inner;
  if (r0 == r1) {
    prefixed(r0, lo - r0 * inner, hi - r0 * inner);
    return out;
  }
  if (lo % inner != 0) prefixed(r0++, lo % inner, inner);
  const int64_t full_end = hi % inner == 0 ? r1 + 1 : r1;  // rows [r0, full_end) are whole
  if (full_end > r0) {
    Box bx;
    bx.start.assign(shape.size(), 0);
    bx.start[0] = r0;
    bx.count = shape;
    bx.count[0] = full_end - r0;
    out.push_back(std::move(bx));
  }
  if (hi % inner != 0) prefixed(r1, 0, hi % inner);
  return out;
}

uint64_t xxh3(const void* data, int64_t bytes) {
  return XXH3_64bits(data, static_cast<size_t>(bytes));
}

std::vector<uint64_t> block_hashes(const void* data, int64_t bytes, int64_t block_bytes) {
  std::vector<uint64_t> out;
  const auto* p = static_cast<const unsigned char*>(data);
  for (int64_t b = 0; b < bytes; b += block_bytes) out.push_back(xxh3(p + b, std::min(block_bytes, bytes - b)));
  return out;
}

}  // namespace shardgan::ckpt
