#include "shardgan/util/isolate.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace shardgan {
namespace {

// The child's report: the problems, each followed by a NUL.
void send_all(int fd, const std::string& msg) {
  for (size_t off = 0; off < msg.size();) {
    const ssize_t n = ::write(fd, msg.data() + off, msg.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);
    off += static_cast<size_t>(n);
  }
}

void run_here(const std::string& what, const std::function<void(std::vector<std::string>&)>& fn,
              std::vector<std::string>& found) {
  try {
    fn(found);
  } catch (const std::exception& e) {
    found.push_back(what + ": " + e.what());
  } catch (...) {
    found.push_back(what + ": unknown error");
  }
}

}  // namespace

std::string IsolatedResult::failure() const {
  std::ostringstream os;
  if (timed_out) {
    os << "did not finish within " << deadline_s << " s";
  } else if (signal != 0) {
    os << "crashed (signal " << signal << ", " << ::strsignal(signal) << ")";
  } else if (exit_status != 0) {
    os << "exited with status " << exit_status;
  }
  return os.str();
}

IsolatedResult run_isolated(const std::string& what, const std::function<void(std::vector<std::string>&)>& fn,
                            double deadline_s) {
  IsolatedResult res;
  res.deadline_s = deadline_s;
  int fds[2];
  if (::pipe(fds) != 0) {
    run_here(what, fn, res.problems);
    return res;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    run_here(what, fn, res.problems);
    return res;
  }
  if (pid == 0) {  // the child: run, send the problems NUL-separated, and leave at once
    ::close(fds[0]);
    ::prctl(PR_SET_NAME, kIsolatedChildName, 0, 0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  // a rank killed mid-read takes its child along
    if (::getppid() == 1) ::_exit(4);           // ... or it died before the line above
    std::vector<std::string> found;
    run_here(what, fn, found);
    std::string msg;
    for (const std::string& p : found) msg += p + '\0';
    send_all(fds[1], msg);
    ::_exit(0);
  }
  ::close(fds[1]);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(deadline_s));
  std::string msg;
  char buf[65536];
  while (true) {
    int wait_ms = -1;
    if (deadline_s > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        res.timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<long long>(left.count(), 1000));
    }
    pollfd p{fds[0], POLLIN, 0};
    const int rc = ::poll(&p, 1, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;  // re-check the deadline
    if (rc < 0) break;
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child closed its end: it is leaving
    msg.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (res.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  for (size_t a = 0; a < msg.size();) {
    const size_t b = msg.find('\0', a);
    if (b == std::string::npos) break;
    res.problems.push_back(msg.substr(a, b - a));
    a = b + 1;
  }
  if (!res.timed_out) {
    if (WIFSIGNALED(status)) {
      res.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      res.exit_status = WEXITSTATUS(status);
    }
  }
  return res;
}

}  // namespace shardgan
