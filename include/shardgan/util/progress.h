#pragma once
/// A progress line on rank 0's terminal: step, losses, images/s and an ETA, redrawn in
/// place ("\r" + erase line) on stdout. Console log records (stderr) erase it first and
/// redraw it after, so the two never garble each other. When stdout is not a terminal
/// (mpirun into a file, CI) nothing is drawn and the plain log lines are all there is.
#include <cstdint>
#include <string>

namespace shardgan {

/// Whether this process's stdout reaches a terminal. Under Open MPI every rank's stdout is a
/// pseudo-terminal (mpirun forwards it), even when mpirun's own stdout is a file, so then
/// the answer is whether mpirun's stdout (found through /proc, walking up the parents) is a
/// terminal; on another node (an orted parent) it is false. SHARDGAN_PROGRESS=1 or 0 forces
/// the answer. Local; reads /proc only.
bool stdout_is_terminal();

/// The one progress line of this process (rank 0 draws it; other ranks never enable it).
class ProgressLine {
 public:
  /// Turns drawing on or off (off by default). Local.
  static void enable(bool on);
  static bool enabled();
  /// Replaces the line's text and draws it (no-op when disabled). Thread-safe.
  static void show(const std::string& text);
  /// Erases the line from the terminal but keeps its text (before other output).
  static void erase();
  /// Draws the kept text again (after other output).
  static void redraw();
  /// Erases the line and forgets its text (at the end of a run).
  static void finish();
};

/// "1h02m", "4m05s" or "12s" for a duration in seconds (negative or non-finite: "?").
std::string format_duration(double seconds);

/// A rate (images per second) with 3 significant digits below 100 ("0.0889", "12.3"), and
/// whole numbers from 100 up ("4521"), so that a slow run never prints "0".
std::string format_rate(double per_second);

}  // namespace shardgan
