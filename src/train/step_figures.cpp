#include "shardgan/train/step_figures.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"

namespace shardgan {

// The tensors stay alive with their Work: an error that unwinds while the all-gather is
// in flight destroys the Work first (which waits), then the buffers it writes.
struct StepFiguresExchange::Posted {
  at::Tensor mine, all;  // [row + votes] this rank's; [N * (row + votes)] every rank's
  int64_t votes = 0;
  std::unique_ptr<Work> work;
  ~Posted() {
    try {
      work.reset();
    } catch (...) {  // unwinding already: the first error is the one reported
    }
  }
};

StepFiguresExchange::StepFiguresExchange(Communicator& world) : world_(world) {}

StepFiguresExchange::~StepFiguresExchange() = default;

void StepFiguresExchange::post(const StepStats& mine, RankRole role, const std::vector<double>& votes) {
  const std::vector<double> row = pack_step_stats(mine, role);
  auto p = std::make_unique<Posted>();
  p->votes = static_cast<int64_t>(votes.size());
  const int64_t w = static_cast<int64_t>(row.size()) + p->votes;
  p->mine = torch::empty({w}, torch::kDouble);
  double* m = p->mine.data_ptr<double>();
  for (size_t i = 0; i < row.size(); ++i) m[i] = row[i];
  for (size_t i = 0; i < votes.size(); ++i) m[row.size() + i] = votes[i];
  p->all = torch::empty({world_.world_size() * w}, torch::kDouble);
  p->work = world_.all_gather_async(p->all, p->mine);
  posted_.push_back(std::move(p));
}

StepStats StepFiguresExchange::finish(std::vector<double>* votes, double* waited_s) {
  if (posted_.empty()) throw std::logic_error("StepFiguresExchange::finish: no step figures in flight");
  std::unique_ptr<Posted> p = std::move(posted_.front());
  posted_.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  p->work->wait();
  if (waited_s) *waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n = world_.world_size(), row = step_stats_row_size(), w = row + p->votes;
  // Rows with the votes cut off, contiguous for reduce_step_stats.
  const at::Tensor rows = p->all.view({n, w}).narrow(1, 0, row).contiguous();
  StepStats out = reduce_step_stats(rows.data_ptr<double>(), n);
  if (votes) {
    votes->assign(static_cast<size_t>(p->votes), 0.0);
    const double* all = p->all.data_ptr<double>();
    for (int64_t i = 0; i < p->votes; ++i) {
      double v = all[row + i];
      for (int64_t r = 1; r < n; ++r) v = std::max(v, all[r * w + row + i]);
      (*votes)[static_cast<size_t>(i)] = v;
    }
  }
  return out;
}

StepStats StepFiguresExchange::exchange(const StepStats& mine, RankRole role) {
  post(mine, role);
  return finish();
}

}  // namespace shardgan
