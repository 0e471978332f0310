#pragma once
/// The exchange that turns every rank's StepStats into the step's figures: one all-gather
/// of each rank's packed row (step_stats.h) over the world communicator, plus caller votes
/// (the trainer's preemption and time-limit votes) of which every rank gets the world's
/// maximum. Shared placement posts it and waits at once; split placement posts it at the
/// step's end and waits only after the next step's work, so that G's ranks run their next
/// forward while D's ranks update (ParaGAN, Shi, Li and You 2024, Sec. 4).
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "shardgan/train/step_stats.h"

namespace shardgan {

class Communicator;

class StepFiguresExchange {
 public:
  /// `world`: every rank of the job; must outlive this object.
  explicit StepFiguresExchange(Communicator& world);
  /// Waits for what is still in flight (errors swallowed: the job is unwinding).
  ~StepFiguresExchange();
  StepFiguresExchange(const StepFiguresExchange&) = delete;
  StepFiguresExchange& operator=(const StepFiguresExchange&) = delete;

  /// Collective, non-blocking: every rank posts one row per step, in the same order.
  /// `mine`: this rank's statistics; `role`: which models' parts it ran; `votes`: values
  /// of which finish() gives the world's maxima (the same count on every rank).
  void post(const StepStats& mine, RankRole role, const std::vector<double>& votes = {});
  /// Waits for the oldest post (CollectiveTimeout after the world's timeout) and returns
  /// its figures, identical on every rank (reduce_step_stats), and the votes' maxima in
  /// `votes` when given. `waited_s` (when given) gets the seconds spent waiting. Throws
  /// std::logic_error when nothing is in flight.
  StepStats finish(std::vector<double>* votes = nullptr, double* waited_s = nullptr);
  /// Posts and finishes at once (collective, blocking).
  StepStats exchange(const StepStats& mine, RankRole role);
  size_t in_flight() const { return posted_.size(); }

 private:
  struct Posted;  // one step's rows and votes, and the all-gather in flight
  Communicator& world_;
  std::deque<std::unique_ptr<Posted>> posted_;
};

}  // namespace shardgan
