#include "shardgan/util/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <filesystem>

#include <fmt/format.h>

namespace shardgan {
namespace {

std::mutex g_mutex;
bool g_enabled = false;
bool g_drawn = false;
std::string g_text;

// Parent pid and command name of `pid` from /proc/<pid>/stat ("pid (comm) state ppid ...").
bool parent_of(long pid, long* ppid, std::string* comm) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(in, s)) return false;
  const size_t open = s.find('('), close = s.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 4 > s.size()) return false;
  *comm = s.substr(open + 1, close - open - 1);
  char state = 0;
  return std::sscanf(s.c_str() + close + 2, "%c %ld", &state, ppid) == 2;
}

bool fd_is_terminal_of(long pid, int fd) {
  std::error_code ec;
  const auto target = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd), ec);
  if (ec) return false;
  const std::string t = target.string();
  return t.rfind("/dev/pts/", 0) == 0 || t.rfind("/dev/tty", 0) == 0 || t == "/dev/console";
}

void draw_locked() {
  std::fputs("\r\033[2K", stdout);
  std::fputs(g_text.c_str(), stdout);
  std::fflush(stdout);
  g_drawn = true;
}

void erase_locked() {
  if (!g_drawn) return;
  std::fputs("\r\033[2K", stdout);
  std::fflush(stdout);
  g_drawn = false;
}

}  // namespace

bool stdout_is_terminal() {
  if (const char* force = std::getenv("SHARDGAN_PROGRESS")) return std::string(force) == "1";
  if (!isatty(STDOUT_FILENO)) return false;
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return true;  // not under Open MPI's pty forwarding
  long pid = getppid();
  for (int depth = 0; depth < 8 && pid > 1; ++depth) {
    long ppid = 0;
    std::string comm;
    if (!parent_of(pid, &ppid, &comm)) return false;
    if (comm == "orted" || comm == "prted") return false;  // a remote node: no terminal here
    if (comm == "mpirun" || comm == "mpiexec" || comm == "orterun" || comm == "prterun") {
      return fd_is_terminal_of(pid, STDOUT_FILENO);
    }
    pid = ppid;
  }
  return false;
}

void ProgressLine::enable(bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!on) erase_locked();
  g_enabled = on;
}

bool ProgressLine::enabled() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_enabled;
}

void ProgressLine::show(const std::string& text) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_enabled) return;
  g_text = text;
  draw_locked();
}

void ProgressLine::erase() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_enabled) erase_locked();
}

void ProgressLine::redraw() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_enabled && !g_text.empty()) draw_locked();
}

void ProgressLine::finish() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_enabled) erase_locked();
  g_text.clear();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = std::llround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", s);
  }
  return buf;
}

std::string format_rate(double per_second) {
  if (!(per_second < 100)) return fmt::format("{:.0f}", per_second);
  return fmt::format("{:.3g}", per_second);
}

}  // namespace shardgan
