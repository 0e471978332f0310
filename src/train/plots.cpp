#include "shardgan/train/plots.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace shardgan {
namespace {

bool have_gnuplot() {
  static const bool found = std::system("command -v gnuplot > /dev/null 2>&1") == 0;
  return found;
}

// One column value: the number, or "?" (gnuplot's missing-data marker here).
std::string cell(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return "?";
  const double v = it->get<double>();
  if (!std::isfinite(v)) return "?";
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

const char* kScript = R"GP(set datafile separator "\t"
set datafile missing "?"
set key top right opaque box
set grid
set xlabel "step"
set output "losses.png"
set title "losses"
plot "train.tsv" using 1:2 with lines title "loss_D" noenhanced, "" using 1:3 with lines title "loss_G" noenhanced
set output "d_outputs.png"
set title "discriminator outputs (mean sigmoid)"
set yrange [0:1]
plot "train.tsv" using 1:4 with lines title "D(x)", "" using 1:5 with lines title "D(G(z))"
set autoscale y
set output "step_time.png"
set title "step time"
set ylabel "seconds per step"
plot "train.tsv" using 1:6 with lines title "step time"
set ylabel ""
)GP";

const char* kFidScript = R"GP(set output "fid.png"
set title "Frechet distance (Fashion-MNIST classifier features)"
set ylabel "FID"
plot "eval.tsv" using 1:2 with linespoints title "G", "" using 1:4 with linespoints title "EMA of G"
)GP";

}  // namespace

bool write_plots(const std::string& run_dir) {
  static bool warned = false;
  if (!have_gnuplot()) {
    if (!warned) spdlog::warn("gnuplot not found on PATH: no plots in {}/plots (training goes on)", run_dir);
    warned = true;
    return false;
  }
  const std::string dir = run_dir + "/plots";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::ofstream train(dir + "/train.tsv"), eval(dir + "/eval.tsv");
  if (!in || !train || !eval) {
    if (!warned) spdlog::warn("cannot read {}/metrics.jsonl or write {}: no plots", run_dir, dir);
    warned = true;
    return false;
  }
  bool any_eval = false;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step")) continue;
    const std::string step = cell(j, "step");
    if (j.contains("fid")) {
      any_eval = true;
      eval << step << '\t' << cell(j, "fid") << '\t' << cell(j, "class_acc") << '\t' << cell(j, "fid_ema")
           << '\t' << cell(j, "class_acc_ema") << '\n';
    } else if (j.contains("loss_d")) {
      train << step << '\t' << cell(j, "loss_d") << '\t' << cell(j, "loss_g") << '\t' << cell(j, "d_real") << '\t'
            << cell(j, "d_fake") << '\t' << cell(j, "step_time_s") << '\n';
    }
  }
  train.close();
  eval.close();
  {
    std::ofstream gp(dir + "/plots.gp");
    gp << "set terminal pngcairo size 800,500 noenhanced\n" << kScript;
    if (any_eval) gp << kFidScript;
  }
  const std::string cmd = "cd '" + dir + "' && timeout 60 gnuplot plots.gp > gnuplot.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    if (!warned) spdlog::warn("gnuplot failed (see {}/gnuplot.log): plots may be missing", dir);
    warned = true;
    return false;
  }
  return true;
}

}  // namespace shardgan
