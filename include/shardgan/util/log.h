#pragma once
/// One spdlog logger per process, named "shardgan", with the rank in every line. Rank 0's
/// console gets info and above; every rank's file <run_dir>/logs/rank-<r>.log gets debug.
/// SPDLOG_LEVEL overrides the console level.
#include <string>

#include <spdlog/spdlog.h>

namespace shardgan {

/// Installs the logger as spdlog's default. Local; call once per process. An empty
/// `run_dir` logs to the console only.
void init_logging(int rank, const std::string& run_dir);

}  // namespace shardgan
