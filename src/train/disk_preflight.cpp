// Disk pre-flight (preflight.h: disk_report, check_disk): the offload files and the
// checkpoints a run will write on this node, against the free space of their filesystems.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "checkpoint/save_parts.h"  // ckpt_detail::committed_step: the rotation's own rule
#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/train/preflight.h"

namespace shardgan {
namespace {

namespace fs = std::filesystem;

// The nearest folder of `p` that exists (a run's folders usually do not, yet).
fs::path existing_ancestor(fs::path p) {
  std::error_code ec;
  p = fs::absolute(p, ec);
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return p;
}

int64_t available_bytes(const fs::path& existing) {
  std::error_code ec;
  const fs::space_info s = fs::space(existing, ec);
  return ec ? -1 : static_cast<int64_t>(s.available);
}

dev_t device_of(const fs::path& existing) {
  struct stat st {};
  return ::stat(existing.c_str(), &st) == 0 ? st.st_dev : dev_t(-1);
}

// Bytes of this run's offload files already in `dir` (a resumed or restarted run): the store
// truncates and reserves them again, so their space counts as free.
int64_t existing_offload_bytes(const fs::path& dir) {
  std::error_code ec;
  int64_t n = 0;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = (name.rfind("generator.rank", 0) == 0 || name.rfind("discriminator.rank", 0) == 0) &&
                      e.path().extension() == ".offload";
    if (ours && e.is_regular_file(ec)) n += static_cast<int64_t>(e.file_size(ec));
  }
  return n;
}

// Leftovers of interrupted saves in checkpoints folder `dir`: step-* directories that are not
// committed (*.tmp, *.old, *.del; ckpt_detail::committed_step), which the next save's commit
// deletes, and the bytes of their files.
std::pair<int64_t, int64_t> leftover_checkpoints(const fs::path& dir) {
  std::error_code ec;
  int64_t n = 0, bytes = 0;
  if (!fs::is_directory(dir, ec)) return {0, 0};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !e.is_directory(ec) || ckpt_detail::committed_step(name) >= 0) continue;
    ++n;
    for (fs::recursive_directory_iterator it(e.path(), ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_regular_file(ec)) bytes += static_cast<int64_t>(it->file_size(ec));
    }
  }
  return {n, bytes};
}

std::string gb(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GB", static_cast<double>(b) / 1e9);
  return s;
}

}  // namespace

int64_t checkpoint_bytes_needed(int64_t checkpoint_bytes, int64_t at_once, int64_t leftover_bytes) {
  if (at_once <= 0) return 0;
  // The first save writes before anything is deleted; its commit deletes the leftovers with
  // the rotated checkpoints, and each later save waits for that deletion before it writes.
  return std::max(checkpoint_bytes, checkpoint_bytes * at_once - std::max<int64_t>(leftover_bytes, 0));
}

int64_t checkpoint_saves(const TrainConfig& cfg) {
  const int64_t periodic = cfg.checkpoint_every > 0 ? cfg.steps / cfg.checkpoint_every : 0;
  const bool last_is_periodic = cfg.checkpoint_every > 0 && cfg.steps % cfg.checkpoint_every == 0;
  return periodic + (cfg.final_checkpoint && !last_is_periodic ? 1 : 0);
}

nlohmann::json disk_report(const TrainConfig& cfg, int64_t offload_bytes, int64_t checkpoint_bytes) {
  std::string offload_dir = cfg.g_optim.offload.path;
  if (offload_dir.empty()) offload_dir = cfg.d_optim.offload.path;
  if (offload_dir.empty()) offload_dir = cfg.run_dir + "/offload";  // the trainer's default
  const fs::path ckpt_dir = fs::path(cfg.run_dir) / "checkpoints";
  const fs::path off_fs = existing_ancestor(offload_dir), ckpt_fs = existing_ancestor(ckpt_dir);
  // The newest train.keep_checkpoints stay, and one more until a save's rotation: at most
  // keep + 1 at once, of which `present` already take their space.
  const int64_t saves = checkpoint_saves(cfg), present = committed_checkpoint_count(ckpt_dir.string());
  const int64_t copies =
      saves == 0 ? 0 : std::max<int64_t>(1, std::min<int64_t>(present + saves, cfg.keep_checkpoints + 1) - present);
  nlohmann::json d;
  d["offload_path"] = offload_dir;
  d["offload_bytes"] = offload_bytes;
  d["offload_bytes_present"] = offload_bytes > 0 ? existing_offload_bytes(offload_dir) : 0;
  d["offload_available_bytes"] = available_bytes(off_fs);
  d["checkpoint_path"] = ckpt_dir.string();
  d["checkpoint_bytes"] = checkpoint_bytes;
  d["checkpoint_saves"] = saves;
  d["checkpoints_present"] = present;
  d["checkpoints_at_once"] = copies;
  const auto [leftovers, leftover_bytes] = leftover_checkpoints(ckpt_dir);
  d["leftovers_present"] = leftovers;
  d["leftover_bytes"] = leftover_bytes;
  d["checkpoint_bytes_needed"] = checkpoint_bytes_needed(checkpoint_bytes, copies, leftover_bytes);
  d["checkpoint_available_bytes"] = available_bytes(ckpt_fs);
  d["same_filesystem"] = device_of(off_fs) == device_of(ckpt_fs);
  return d;
}

void check_disk(const TrainConfig& cfg, const nlohmann::json& report) {
  if (!report.contains("disk")) return;
  const nlohmann::json& d = report["disk"];
  const int64_t off = d["offload_bytes"].get<int64_t>() - d["offload_bytes_present"].get<int64_t>();
  const int64_t leftovers = d.value("leftovers_present", int64_t{0});
  const int64_t leftover_bytes = d.value("leftover_bytes", int64_t{0});
  const int64_t ckpt = checkpoint_bytes_needed(d["checkpoint_bytes"].get<int64_t>(),
                                               d["checkpoints_at_once"].get<int64_t>(), leftover_bytes);
  const int64_t off_avail = d["offload_available_bytes"].get<int64_t>();
  const int64_t ckpt_avail = d["checkpoint_available_bytes"].get<int64_t>();
  if (off_avail < 0 || ckpt_avail < 0) return;  // unknown: the writes report ENOSPC themselves
  const std::string skip = " Or set train.skip_disk_check: true to run anyway. `shardgan-train CONFIG --dry-run` prints "
                           "the figures (\"disk\").";
  const std::string ckpt_keys =
      "Free space under run.dir, point run.dir at a larger disk, lower train.keep_checkpoints, or save less "
      "(train.checkpoint_every 0, train.final_checkpoint false).";
  if (off > 0 && off > off_avail) {
    throw DiskPreflightError(cfg.source + ": disk pre-flight: the offload files of this node's ranks need " + gb(off) +
                             " under offload.path '" + d["offload_path"].get<std::string>() + "', but only " +
                             gb(off_avail) + " are free there. Point offload.path at a larger disk, use more nodes, "
                             "or offload less (offload.<model>.gradient, .param)." + skip);
  }
  const bool same = d["same_filesystem"].get<bool>();
  const int64_t ckpt_room = same ? off_avail - std::max<int64_t>(off, 0) : ckpt_avail;
  if (ckpt > 0 && ckpt > ckpt_room) {
    throw DiskPreflightError(
        cfg.source + ": disk pre-flight: this node's ranks will add up to " +
        std::to_string(d["checkpoints_at_once"].get<int64_t>()) + " checkpoint(s) of " +
        gb(d["checkpoint_bytes"].get<int64_t>()) + " under '" + d["checkpoint_path"].get<std::string>() +
        "' (the run saves " + std::to_string(d["checkpoint_saves"].get<int64_t>()) + ", keeps the newest " +
        std::to_string(cfg.keep_checkpoints) + " with the " + std::to_string(d.value("checkpoints_present", int64_t{0})) +
        " there now, and holds one more while a save commits), " + gb(ckpt) + " in all" +
        (leftovers > 0 ? " after the first save's commit deletes the " + std::to_string(leftovers) +
                             " leftover(s) of interrupted saves there (*.tmp, *.old, *.del: " + gb(leftover_bytes) + ")"
                       : "") +
        ", but only " + gb(ckpt_room) +
        " are free there" + (same && off > 0 ? " once the offload files (" + gb(off) + ") are written" : "") + ". " +
        ckpt_keys + skip);
  }
}

}  // namespace shardgan
