#pragma once
/// Training curves as PNG files, drawn by gnuplot from <run>/metrics.jsonl.
#include <string>

namespace shardgan {

/// Local (rank 0 calls it). Reads <run_dir>/metrics.jsonl and writes into <run_dir>/plots/:
///  - losses.png: loss_d and loss_g over steps;
///  - d_outputs.png: D(x) and D(G(z)) (mean sigmoid of the logits) over steps;
///  - fid.png: FID (and the EMA generator's FID) over steps, when evaluations were logged;
///  - step_time.png: seconds per step;
/// plus the tables they are drawn from (train.tsv, eval.tsv) and the gnuplot script
/// (plots.gp). gnuplot is optional: without it on PATH this warns once per process and
/// returns false; a gnuplot failure (exit status, 60 s timeout) also warns and returns false.
/// Never throws for I/O problems (training goes on). Returns true when gnuplot succeeded.
bool write_plots(const std::string& run_dir);

}  // namespace shardgan
