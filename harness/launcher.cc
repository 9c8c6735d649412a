// Process-per-rank launch with deadlines (see launcher.h).
#include "harness/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "harness/parity.h"
#include "harness/worker.h"

namespace pipecheck::harness {
namespace {

namespace fs = std::filesystem;

// A port that was free a moment ago on 127.0.0.1 (the kernel's choice).
int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  if (!ok) throw std::runtime_error(fmt::format("cannot find a free loopback port: {}", std::strerror(errno)));
  return ntohs(address.sin_port);
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  int status = 0;  // waitpid status once exited
  std::string log;
};

pid_t SpawnRank(const scenarios::Scenario& scenario, const LaunchOptions& options, const std::string& directory,
                int rank, int port, const std::string& log) {
  const std::vector<std::string> args = {options.executable, "worker", "--scenarios", options.scenarios_path,
                                         "--scenario", scenario.name, "--out", directory, "--threads",
                                         std::to_string(options.threads_per_rank)};
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (pid > 0) return pid;
  // Child: die with the launcher, write to its own log, become the worker.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(scenario.world_size).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execv(options.executable.c_str(), argv.data());
  fmt::print(stderr, "exec {} failed: {}\n", options.executable, std::strerror(errno));
  _exit(127);
}

// The last `count` non-empty lines of a log, joined with " | ".
std::string Tail(const std::string& path, size_t count = 4) {
  std::ifstream stream(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(stream, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  std::vector<std::string> last(lines.end() - std::min(count, lines.size()), lines.end());
  std::string joined;
  for (const auto& item : last) joined += (joined.empty() ? "" : " | ") + item;
  return joined.empty() ? "(no output)" : joined;
}

std::string HowItEnded(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

void KillAndReap(std::vector<Rank>& ranks) {
  for (auto& rank : ranks) {
    if (rank.running) kill(rank.pid, SIGKILL);
  }
  for (auto& rank : ranks) {
    if (rank.running) {
      waitpid(rank.pid, &rank.status, 0);
      rank.running = false;
    }
  }
}

// A rank ended badly: anything but a clean exit, except rank 0 reporting a verdict that did
// not meet the expectation (exit 1 with its result written).
bool Failed(const Rank& rank, bool result_written) {
  if (rank.running) return false;
  if (WIFEXITED(rank.status) && WEXITSTATUS(rank.status) == 0) return false;
  return !(rank.rank == 0 && result_written && WIFEXITED(rank.status) && WEXITSTATUS(rank.status) == 1);
}

}  // namespace

std::string CurrentExecutable() { return fs::read_symlink("/proc/self/exe").string(); }

reports::ScenarioReport LaunchScenario(const scenarios::Scenario& scenario, const LaunchOptions& options) {
  const fs::path directory = fs::path(options.work_directory) / scenario.name;
  fs::create_directories(directory);
  const fs::path result_path = directory / kResultFile;
  fs::remove(result_path);
  const int port = FreeLoopbackPort();

  std::vector<Rank> ranks;
  for (int r = 0; r < scenario.world_size; ++r) {
    Rank rank;
    rank.rank = r;
    rank.log = (directory / fmt::format("rank{}.log", r)).string();
    rank.pid = SpawnRank(scenario, options, directory.string(), r, port, rank.log);
    ranks.push_back(rank);
  }

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_seconds);
  while (true) {
    bool any_running = false;
    for (auto& rank : ranks) {
      if (rank.running && waitpid(rank.pid, &rank.status, WNOHANG) == rank.pid) rank.running = false;
      any_running = any_running || rank.running;
    }
    const bool result_written = fs::exists(result_path);
    for (const auto& rank : ranks) {
      if (!Failed(rank, result_written)) continue;
      KillAndReap(ranks);
      return FailedScenarioReport(scenario, "ERROR",
                                  fmt::format("rank {} {}; its last output: {}", rank.rank, HowItEnded(rank.status),
                                              Tail(rank.log)));
    }
    if (!any_running) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<std::string> stuck;
      for (const auto& rank : ranks) {
        if (rank.running) stuck.push_back(std::to_string(rank.rank));
      }
      KillAndReap(ranks);
      return FailedScenarioReport(
          scenario, "TIMEOUT",
          fmt::format("rank(s) {} still running after the {:.0f} s deadline; rank {}'s last output: {}",
                      fmt::join(stuck, ", "), options.timeout_seconds, stuck.front(), Tail(ranks[std::stoi(stuck.front())].log)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream stream(result_path);
  if (!stream) {
    return FailedScenarioReport(scenario, "ERROR",
                                fmt::format("every rank exited cleanly but rank 0 wrote no result; its last output: {}",
                                            Tail(ranks[0].log)));
  }
  std::stringstream text;
  text << stream.rdbuf();
  return reports::FromJson(text.str());
}

}  // namespace pipecheck::harness
