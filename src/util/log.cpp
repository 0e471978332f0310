#include "shardgan/util/log.h"

#include <cstdlib>
#include <filesystem>

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace shardgan {

void init_logging(int rank, const std::string& run_dir) {
  std::vector<spdlog::sink_ptr> sinks;
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
  sinks.push_back(console);
  if (!run_dir.empty()) {
    std::filesystem::create_directories(run_dir + "/logs");
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
        run_dir + "/logs/rank-" + std::to_string(rank) + ".log", /*truncate=*/false);
    file->set_level(spdlog::level::debug);
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("shardgan", sinks.begin(), sinks.end());
  logger->set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v");
  logger->set_level(spdlog::level::debug);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  if (std::getenv("SPDLOG_LEVEL")) spdlog::cfg::load_env_levels();
}

}  // namespace shardgan
