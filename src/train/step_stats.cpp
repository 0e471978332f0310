#include "shardgan/train/step_stats.h"

#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardgan {

namespace {

bool measures(RankRole role, StatSide side) {
  switch (side) {
    case StatSide::kEvery: return true;
    case StatSide::kGenerator: return role != RankRole::kDiscriminator;
    case StatSide::kDiscriminator: return role != RankRole::kGenerator;
  }
  return false;
}

RankRole role_of(double v) {
  if (v == 0) return RankRole::kBoth;
  if (v == 1) return RankRole::kGenerator;
  if (v == 2) return RankRole::kDiscriminator;
  throw std::invalid_argument("reduce_step_stats: a row's role is " + std::to_string(v) + ", not 0, 1 or 2");
}

}  // namespace

int64_t step_stats_row_size() {
  int64_t n = 1;
  StepStats s;
  for_each_stat(s, [&](const char*, StatSide, StatReduce, auto&) { ++n; });
  return n;
}

std::vector<double> pack_step_stats(const StepStats& s, RankRole role) {
  std::vector<double> row{static_cast<double>(role)};
  for_each_stat(s, [&](const char*, StatSide, StatReduce, const auto& v) { row.push_back(static_cast<double>(v)); });
  return row;
}

StepStats reduce_step_stats(const double* rows, int64_t n_ranks) {
  const int64_t w = step_stats_row_size();
  std::vector<RankRole> roles;
  for (int64_t r = 0; r < n_ranks; ++r) roles.push_back(role_of(rows[r * w]));
  StepStats out;
  int64_t col = 1;
  for_each_stat(out, [&](const char*, StatSide side, StatReduce how, auto& field) {
    double acc = 0;
    int64_t count = 0;
    bool any = false;
    for (int64_t r = 0; r < n_ranks; ++r) {
      if (!measures(roles[static_cast<size_t>(r)], side)) continue;
      const double v = rows[r * w + col];
      if (how == StatReduce::kSame) {
        if (count == 0) acc = v;
      } else if (how == StatReduce::kAny) {
        any = any || v != 0;
      } else {
        acc += v;  // kMean and kSum: summed in rank order
      }
      ++count;
    }
    if (how == StatReduce::kMean && count > 0) acc /= static_cast<double>(count);
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (std::is_same_v<T, bool>) {
      field = any;
    } else {
      field = static_cast<T>(acc);
    }
    ++col;
  });
  return out;
}

}  // namespace shardgan
