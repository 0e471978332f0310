#include "shardgan/util/log.h"

#include <cstdlib>
#include <filesystem>

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "shardgan/util/progress.h"

namespace shardgan {
namespace {

// The console sink, but a record first erases rank 0's progress line (progress.h) and
// draws it again after itself, so that the line stays at the bottom of the terminal.
class ProgressAwareSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ProgressAwareSink(spdlog::sink_ptr inner) : inner_(std::move(inner)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    ProgressLine::erase();
    inner_->log(msg);
    inner_->flush();
    ProgressLine::redraw();
  }
  void flush_() override { inner_->flush(); }
  // The logger's pattern belongs to the console sink that formats the records.
  void set_pattern_(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }

 private:
  spdlog::sink_ptr inner_;
};

}  // namespace

void init_logging(int rank, const std::string& run_dir) {
  std::vector<spdlog::sink_ptr> sinks;
  auto console = std::make_shared<ProgressAwareSink>(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
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
