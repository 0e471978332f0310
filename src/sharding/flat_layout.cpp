#include "shardgan/sharding/flat_layout.h"

#include <stdexcept>
#include <string>

namespace shardgan {
namespace {
int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
}  // namespace

FlatLayout make_flat_layout(const std::vector<int64_t>& numels, int64_t align, int world_size, int stage) {
  if (align < 1 || world_size < 1) {
    throw std::invalid_argument("flat layout: align (" + std::to_string(align) + ") and world size (" +
                                std::to_string(world_size) + ") must be >= 1");
  }
  FlatLayout l;
  int64_t end = 0;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("flat layout: a parameter has " + std::to_string(n) + " elements");
    const int64_t o = round_up(end, align);
    l.offsets.push_back(o);
    end = o + n;
    l.numel += n;
  }
  l.data_end = end;
  if (stage == 0) {
    l.padded_numel = l.shard_numel = round_up(end, align);
  } else {
    l.shard_numel = round_up((end + world_size - 1) / world_size, align);
    l.padded_numel = l.shard_numel * world_size;
  }
  return l;
}

}  // namespace shardgan
