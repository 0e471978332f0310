#include "index_layout.h"

#include <algorithm>

#include "shardgan/checkpoint/shard_io.h"

namespace shardgan::ckpt {

const std::string kDoWhat =
    " Restore the file from a copy, or resume from an older checkpoint "
    "(`shardgan-ckpt verify DIR` checks one).";

std::vector<IndexDataset> index_layout(const Manifest& m) {
  std::vector<IndexDataset> out;
  for (const ModelEntry& mo : m.models) {
    const h5::DType dt = parse_dtype(mo.dtype);
    for (const std::string& kind : state_kinds(mo)) {
      for (const UnitEntry& u : mo.units) {
        const std::string src = unit_dataset(mo.name, u.name, kind);
        for (const ParamEntry& p : u.params) {
          IndexDataset d;
          d.path = index_path(mo.name, kind, u.name + "." + p.name);
          d.dt = dt;
          // A 0-d parameter appears as shape [1] (a VDS needs at least one dimension).
          d.shape = p.shape.empty() ? std::vector<int64_t>{1} : p.shape;
          d.is_param = true;
          d.unit = u.name;
          d.flat_offset = p.offset;
          for (const ShardEntry& sh : u.shards) {
            const int64_t a = std::max(p.offset, sh.offset);
            const int64_t b = std::min(p.offset + p.numel, sh.offset + sh.numel);
            if (a >= b) continue;
            const int64_t src_numel = m.file(sh.rank).datasets.at(src).numel;
            int64_t cur = a - sh.offset;
            for (Box& bx : flat_range_boxes(d.shape, a - p.offset, b - p.offset)) {
              const int64_t n = product(bx.count);
              d.pieces.push_back({rank_file_name(sh.rank), src, src_numel, cur, bx.start, bx.count});
              cur += n;
            }
          }
          out.push_back(std::move(d));
        }
      }
    }
    for (const BufferEntry& b : mo.buffers) {
      IndexDataset d;
      d.path = mo.name + "/buffers/" + b.name;
      d.dt = parse_dtype(b.dtype);
      d.shape = b.shape.empty() ? std::vector<int64_t>{1} : b.shape;
      const int64_t n = product(d.shape);
      for (Box& bx : flat_range_boxes(d.shape, 0, n)) {
        d.pieces.push_back({rank_file_name(b.rank), d.path, n, 0, bx.start, bx.count});
      }
      out.push_back(std::move(d));
    }
  }
  return out;
}

}  // namespace shardgan::ckpt
