// Process-per-rank launch with deadlines (see launcher.h).
#include "harness/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "harness/external.h"
#include "harness/fork_server.h"
#include "harness/measurements.h"
#include "harness/parity.h"
#include "harness/resume.h"
#include "harness/scenario_model.h"
#include "harness/worker.h"
#include "pipeline/flight_recorder.h"
#include "pipeline/schedule.h"
#include "reports/report.h"

namespace pipecheck::harness {
namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_interrupt_signal = 0;

void OnInterrupt(int signal) { g_interrupt_signal = signal; }

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
  bool killed_here = false;  // this launcher sent it SIGKILL (a deadline, a peer's failure, an interrupt)
  std::string log;
};

// The CPU binding of a rank, made before fork (the child only makes system calls): its CPUs,
// and the line its log starts with. None when not binding, or when this process's CPUs cannot
// be read.
struct Binding {
  bool bind = false;
  cpu_set_t cpus;
  std::vector<int> listed;  // the same CPUs, for the fork server
  std::string line;
};

Binding BindingOf(const scenarios::Scenario& scenario, const LaunchOptions& options, int rank) {
  Binding binding;
  if (!options.bind_cpus || scenario.device != "cpu") return binding;
  const auto allowed = AllowedCpus();
  const auto mine = CpusOfRank(allowed, rank, static_cast<int>(scenario.Processes()));
  if (mine.empty()) return binding;
  CPU_ZERO(&binding.cpus);
  for (int cpu : mine) CPU_SET(cpu, &binding.cpus);
  binding.listed = mine;
  binding.bind = true;
  binding.line = fmt::format("pipecheck: rank {} bound to CPUs {} of {}\n", rank, fmt::join(mine, ","),
                             fmt::join(allowed, ","));
  return binding;
}

}  // namespace

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::vector<int> allowed;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
  }
  return allowed;
}

int UsableCores() {
  const auto allowed = AllowedCpus();
  int cores = allowed.empty() ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                              : static_cast<int>(allowed.size());
  // A cgroup v2 CPU quota ("QUOTA PERIOD", or "max" for none), as containers and CI runners set it.
  std::ifstream quota_file("/sys/fs/cgroup/cpu.max");
  std::string quota, period;
  if (quota_file >> quota >> period && quota != "max") {
    const double q = std::strtod(quota.c_str(), nullptr), p = std::strtod(period.c_str(), nullptr);
    if (q > 0 && p > 0) cores = std::min(cores, std::max(1, static_cast<int>(std::ceil(q / p))));
  }
  return std::max(1, cores);
}

std::vector<int> CpusOfRank(const std::vector<int>& allowed, int rank, int ranks) {
  const int count = static_cast<int>(allowed.size());
  if (ranks < 1 || rank < 0 || rank >= ranks || count < ranks) return allowed;
  const int base = count / ranks, extra = count % ranks;
  const int first = rank * base + std::min(rank, extra);
  return std::vector<int>(allowed.begin() + first, allowed.begin() + first + base + (rank < extra ? 1 : 0));
}

namespace {

// What one process of a scenario runs: its command line and what it adds to the torchrun
// environment.
struct ProcessCommand {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> environment;
  std::string preload;  // a Python trainer's: what its fork server imports (TrainerPreload), or ""
};

// Rank `rank` of pipecheck's own trainer, or a single phase of another trainer's scenario: a
// worker handed the scenario's plan.
ProcessCommand WorkerCommand(const scenarios::Scenario& scenario, const LaunchOptions& options, const std::string& plan,
                             const std::string& directory, const std::string& phase = "") {
  const int timed_steps = options.timed_steps_given || scenario.timed_steps < 0 ? options.timed_steps
                                                                                 : static_cast<int>(scenario.timed_steps);
  ProcessCommand command;
  command.argv = {options.executable, "worker", "--plan", plan, "--out", directory, "--threads",
                  std::to_string(options.threads_per_rank)};
  if (!phase.empty()) command.argv.insert(command.argv.end(), {"--phase", phase});
  if (phase.empty()) command.argv.insert(command.argv.end(), {"--timed-steps", std::to_string(timed_steps)});
  command.argv.insert(command.argv.end(), options.worker_args.begin(), options.worker_args.end());
  return command;
}

// Rank `rank` of `world` (torchrun's contract in its environment), running `command`.
pid_t SpawnRank(const scenarios::Scenario& scenario, const LaunchOptions& options, const ProcessCommand& command,
                int rank, int world, int port, const std::string& log) {
  const Binding binding = BindingOf(scenario, options, rank);
  // torchrun's variables, then the command's own.
  std::vector<std::pair<std::string, std::string>> environment = {
      {"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
  environment.insert(environment.end(), command.environment.begin(), command.environment.end());
  if (command.argv.size() > 1 && command.argv[1] == "worker" && command.argv[0] == CurrentExecutable()) {
    if (const auto pid = ForkServerSpawn({command.argv, environment, log, binding.listed, binding.line})) return *pid;
  }
  if (!command.preload.empty()) {
    const SpawnRequest request{command.argv, environment, log, binding.listed, binding.line};
    if (const auto pid = PythonForkServerSpawn(TrainerForkServer(), command.preload, request)) return *pid;
  }
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
  // Inherited by the worker's threads and kept across exec.
  if (binding.bind && sched_setaffinity(0, sizeof(binding.cpus), &binding.cpus) == 0) {
    (void)!write(STDERR_FILENO, binding.line.data(), binding.line.size());
  }
  for (const auto& [name, value] : environment) setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& arg : command.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execv(command.argv.front().c_str(), argv.data());
  fmt::print(stderr, "exec {} failed: {}\n", command.argv.front(), std::strerror(errno));
  _exit(127);
}

// What a rank said last: from its last error line ("pipecheck worker ...", or a fault's own
// line) to the end, else its last `count` non-empty lines; joined with " | ".
// Whether `line` raises a Python exception with a message ("RuntimeError: ..." or
// "torch.OutOfMemoryError: ...", after a "[rankN]: " prefix torchrun may add).
bool RaisesException(const std::string& line) {
  size_t at = 0;
  if (line.rfind("[rank", 0) == 0) {
    const size_t end = line.find("]:");
    if (end == std::string::npos) return false;
    at = line.find_first_not_of(' ', end + 2);
    if (at == std::string::npos) return false;
  }
  const size_t colon = line.find(": ", at);
  if (colon == std::string::npos || colon + 2 >= line.size()) return false;
  const std::string name = line.substr(at, colon - at);
  const bool named = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  });
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return named && (ends_with("Error") || ends_with("Exception"));
}

// A process's last lines of output, joined by " | ": the last `count`, or from its last
// "pipecheck worker" or "fault" line on. When an exception raised earlier in the log is not among
// them (a chained Python traceback ends with the wrapping exception, the cause above), its line
// is added: "(first exception in its log: ...)".
std::string Tail(const std::string& path, size_t count = 4) {
  std::ifstream stream(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(stream, line)) {
    // c10's warning when the tensor-memory meter (trainers/meter.cc) sees a block freed that a
    // Python trainer allocated before starting it: the meter's, not the trainer's, words.
    if (line.find("Memory block of unknown size was allocated before the profiling started") != std::string::npos) continue;
    if (!line.empty()) lines.push_back(line);
  }
  size_t first = lines.size() - std::min(count, lines.size());
  for (size_t i = lines.size(); i-- > 0;) {
    if (lines[i].rfind("pipecheck worker", 0) == 0 || lines[i].rfind("fault ", 0) == 0) {
      first = i;
      break;
    }
  }
  std::vector<std::string> last(lines.begin() + first, lines.begin() + std::min(lines.size(), first + 16));
  std::string joined;
  for (const auto& item : last) joined += (joined.empty() ? "" : " | ") + item;
  if (joined.empty()) return "(no output)";
  const auto cause = std::find_if(lines.begin(), lines.end(), RaisesException);
  if (cause != lines.end() && std::find(last.begin(), last.end(), *cause) == last.end()) {
    constexpr size_t kMaxCause = 300;
    joined += fmt::format(" (first exception in its log: {}{})", cause->substr(0, kMaxCause),
                          cause->size() > kMaxCause ? " ..." : "");
  }
  return joined;
}

// The last progress line a worker wrote to its log (without the prefix), or "".
std::string LastProgress(const std::string& path) {
  std::ifstream stream(path, std::ios::binary | std::ios::ate);
  if (!stream) return "";
  const std::streamoff size = stream.tellg();
  stream.seekg(std::max<std::streamoff>(0, size - 4096));
  std::string text((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  const size_t at = text.rfind(kProgressPrefix);
  if (at == std::string::npos) return "";
  const size_t end = text.find('\n', at);
  if (end == std::string::npos) return "";
  return text.substr(at + std::strlen(kProgressPrefix), end - at - std::strlen(kProgressPrefix));
}

std::string HowItEnded(int status) {
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    // Not this launcher's SIGKILL (those ranks are never blamed): the kernel's OOM killer sends
    // it, as do a cgroup's memory limit and an operator's kill -9.
    return "was killed by signal 9 (Killed) from outside pipecheck: the kernel's OOM killer sends it when memory runs "
           "out (see dmesg), as does kill -9";
  }
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

void KillAndReap(std::vector<Rank>& ranks) {
  for (auto& rank : ranks) {
    if (rank.running) {
      kill(rank.pid, SIGKILL);
      rank.killed_here = true;
    }
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

void InstallInterruptHandlers() {
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

std::string ProcessName(const scenarios::Scenario& scenario, int process) {
  if (scenario.data_parallel <= 1 || scenario.ExternalTrainer()) return fmt::format("rank {}", process);
  return fmt::format("rank {} (replica {} rank {})", process, process / scenario.world_size,
                     process % scenario.world_size);
}

DeadlineVerdict JudgeDeadline(double elapsed_seconds, double since_progress_seconds, double deadline_seconds) {
  if (elapsed_seconds <= deadline_seconds) return DeadlineVerdict::kRunning;
  if (elapsed_seconds > kDeadlineCap * deadline_seconds) return DeadlineVerdict::kOverCap;
  const double stall = std::min(kStallSeconds, deadline_seconds / 2);
  return since_progress_seconds >= stall ? DeadlineVerdict::kStalled : DeadlineVerdict::kRunning;
}

std::optional<double> CpuSeconds(pid_t pid) {
  std::ifstream stream(fmt::format("/proc/{}/stat", pid));
  std::string text;
  if (!std::getline(stream, text)) return std::nullopt;
  // Fields after the command (which may hold spaces and parentheses): state is field 3, utime
  // and stime fields 14 and 15.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int index = 3; index <= 15 && fields >> field; ++index) {
    if (index == 14) utime = std::strtod(field.c_str(), nullptr);
    if (index == 15) stime = std::strtod(field.c_str(), nullptr);
  }
  if (!fields) return std::nullopt;
  const long ticks = sysconf(_SC_CLK_TCK);
  return ticks > 0 ? std::optional<double>((utime + stime) / static_cast<double>(ticks)) : std::nullopt;
}

double DefaultDeadlineSeconds(const scenarios::Scenario& scenario) {
  const auto model = ToModelConfig(scenario);
  const double parameters = static_cast<double>(model.ParameterCount());
  const double flops_per_step = 6.0 * parameters * static_cast<double>(scenario.batch * scenario.seq_len);
  // Another trainer's ranks start a Python and import PyTorch first (seconds each on a busy machine).
  const double startup = scenario.ExternalTrainer() ? 60.0 : 0.0;
  // Recomputation runs every forward twice: 8 of 6 flops.
  const double recompute = scenario.recompute ? 8.0 / 6.0 : 1.0;
  return 30.0 + startup + 3.0 * recompute * static_cast<double>(scenario.steps) * flops_per_step / 1e9;
}

namespace {

// Gloo's words for a peer that went away: its end closed or reset while this rank read, a write
// to it refused (EPIPE: pipecheck's ranks ignore SIGPIPE), or an operation on the closed pair.
bool LostConnection(const std::string& output) {
  for (const char* words : {"Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket closed"}) {
    if (output.find(words) != std::string::npos) return true;
  }
  return false;
}

std::vector<std::vector<pipeline::FlightEntry>> FlightRecords(const fs::path& directory, size_t ranks) {
  std::vector<std::vector<pipeline::FlightEntry>> records;
  for (size_t r = 0; r < ranks; ++r) {
    records.push_back(pipeline::ReadFlightRecord(FlightRecordPath(directory.string(), static_cast<int>(r))));
  }
  return records;
}

// The timeline up to where the ranks stopped, from their flight records (host clock; an action
// that never ended is drawn up to the last moment any rank recorded): what a failed or stuck
// scenario's trace and picture show.
void AttachPartialTimeline(reports::ScenarioReport& report, const std::string& scenario,
                           const std::vector<std::vector<pipeline::FlightEntry>>& records) {
  double last = 0.0;
  for (const auto& entries : records) {
    for (const auto& e : entries) last = std::max({last, e.start_us, e.end_us.value_or(0.0)});
  }
  for (size_t rank = 0; rank < records.size(); ++rank) {
    for (const auto& e : records[rank]) {
      // A phase outside the schedule (gradient_sync, results_to_rank_0) has no row.
      if (const auto timing = pipeline::TimingOf(e, last)) {
        report.timeline.push_back(TimelineRowOf(scenario, static_cast<int64_t>(rank), *timing, /*step_clock=*/false));
      }
    }
  }
}

// Where a rank's flight record ends: "after ACTION (step S)", "in ACTION (step S)" when that
// action never ended, "before its first action".
std::string WhereItStopped(const std::vector<pipeline::FlightEntry>& entries) {
  if (entries.empty()) return "before its first action";
  const auto& last = entries.back();
  return fmt::format("{} {} (step {})", last.end_us ? "after" : "in", last.what, last.step);
}

// One rank failed: its peers usually fail a moment later only because it went away. Wait
// briefly for them, then blame the rank whose failure is not a lost connection (the lowest
// such rank), name the others, and end every rank still running. Where every failure is a lost
// connection and a rank exited with code 0, that rank is the cause: it left while its peers still
// needed it (a rank whose data ran out a step early, a trainer's sys.exit(0)), and no crash of
// its own says so. `flight_records`: the directory of the ranks' flight records (null: none
// kept), read once every rank has ended: where the clean exit stopped, and the partial timeline
// the report carries.
reports::ScenarioReport BlameFailedRank(const scenarios::Scenario& scenario, std::vector<Rank>& ranks,
                                        bool result_written, const fs::path* flight_records) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (auto& rank : ranks) {
    if (rank.running && waitpid(rank.pid, &rank.status, WNOHANG) == rank.pid) rank.running = false;
  }
  KillAndReap(ranks);
  const auto records = flight_records ? FlightRecords(*flight_records, ranks.size())
                                      : std::vector<std::vector<pipeline::FlightEntry>>();
  // Ranks that failed on their own, not by the SIGKILL this launcher sent, with what they said.
  // A rank killed from outside is blamed first: its peers only lost their connection to it.
  std::vector<std::pair<const Rank*, std::string>> failed;
  for (const auto& rank : ranks) {
    if (!Failed(rank, result_written) || rank.killed_here) continue;
    const bool killed_outside = WIFSIGNALED(rank.status) && WTERMSIG(rank.status) == SIGKILL;
    failed.emplace(killed_outside ? failed.begin() : failed.end(), &rank, Tail(rank.log));
  }
  if (failed.empty()) failed.emplace_back(&ranks.front(), Tail(ranks.front().log));
  const Rank& first = *failed.front().first;
  const bool killed_outside = WIFSIGNALED(first.status) && WTERMSIG(first.status) == SIGKILL && !first.killed_here;
  auto blamed = killed_outside ? failed.begin() : std::find_if(failed.begin(), failed.end(), [](const auto& f) {
    return !LostConnection(f.second);
  });
  if (blamed == failed.end()) blamed = failed.begin();
  // The rank that exited cleanly, where the blamed rank only lost its connection.
  const auto exited_cleanly = [](const Rank& r) {
    return !r.killed_here && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
  };
  const auto left =
      LostConnection(blamed->second) ? std::find_if(ranks.begin(), ranks.end(), exited_cleanly) : ranks.end();
  std::string message;
  if (left != ranks.end()) {
    std::vector<std::string> cut_off;
    for (const auto& [rank, output] : failed) cut_off.push_back(std::to_string(rank->rank));
    message = fmt::format(
        "{} exited with code 0{} while its peers still needed it: rank(s) {} then lost their connection; "
        "its last output: {}; {}'s: {}",
        ProcessName(scenario, left->rank), records.empty() ? "" : " " + WhereItStopped(records[left->rank]),
        fmt::join(cut_off, ", "), Tail(left->log), ProcessName(scenario, blamed->first->rank), blamed->second);
  } else {
    std::vector<std::string> others;
    for (const auto& [rank, output] : failed) {
      if (rank != blamed->first) others.push_back(std::to_string(rank->rank));
    }
    message = fmt::format("{} {}; its last output: {}{}", ProcessName(scenario, blamed->first->rank),
                          HowItEnded(blamed->first->status), blamed->second,
                          others.empty() ? "" : fmt::format(" (then rank(s) {} failed too)", fmt::join(others, ", ")));
  }
  auto report = FailedScenarioReport(scenario, reports::Status::kError, message);
  if (flight_records) AttachPartialTimeline(report, scenario.name, records);
  return report;
}

// What shows a phase's processes are alive and working: CPU time used, flight records and logs
// grown. Sampled every kSampleSeconds; `computing[r]` says whether rank r used CPU time in the
// last sample (a rank blocked in a receive uses none).
class ProgressWatch {
 public:
  static constexpr double kSampleSeconds = 0.5;
  // A rank using at least this share of one core over a sample is computing.
  static constexpr double kComputingShare = 0.05;

  ProgressWatch(const fs::path& directory, size_t ranks, bool flight_records)
      : directory_(directory), flight_records_(flight_records), cpu_(ranks, -1.0), record_(ranks, 0),
        log_(ranks, 0), computing_(ranks, false), last_progress_(std::chrono::steady_clock::now()),
        last_sample_(last_progress_) {}

  // Samples when a sample is due; returns the seconds since any rank last made progress.
  double SinceProgress(const std::vector<Rank>& ranks) {
    const auto now = std::chrono::steady_clock::now();
    const double interval = std::chrono::duration<double>(now - last_sample_).count();
    if (interval >= kSampleSeconds) {
      last_sample_ = now;
      bool progressed = false;
      for (size_t r = 0; r < ranks.size(); ++r) {
        computing_[r] = false;
        if (!ranks[r].running) continue;
        if (const auto cpu = CpuSeconds(ranks[r].pid)) {
          computing_[r] = cpu_[r] >= 0 && *cpu - cpu_[r] >= kComputingShare * interval;
          progressed = progressed || computing_[r];
          cpu_[r] = *cpu;
        }
        progressed = Grew(ranks[r].log, log_[r]) || progressed;
        if (flight_records_) progressed = Grew(FlightRecordPath(directory_.string(), ranks[r].rank), record_[r]) || progressed;
      }
      if (progressed) last_progress_ = now;
    }
    return std::chrono::duration<double>(now - last_progress_).count();
  }

  bool Computing(size_t rank) const { return rank < computing_.size() && computing_[rank]; }

 private:
  static bool Grew(const std::string& path, uintmax_t& size) {
    std::error_code error;
    const uintmax_t now = fs::file_size(path, error);
    if (error || now == size) return false;
    size = now;
    return true;
  }

  fs::path directory_;
  bool flight_records_;
  std::vector<double> cpu_;
  std::vector<uintmax_t> record_, log_;
  std::vector<bool> computing_;
  std::chrono::steady_clock::time_point last_progress_, last_sample_;
};

// The TIMEOUT row of ranks still running at the deadline (ended here): what each was doing, from
// its flight record (pipecheck's own ranks keep one), then what it last said.
reports::ScenarioReport TimedOut(const scenarios::Scenario& scenario, const LaunchOptions& options,
                                 const fs::path& directory, const std::vector<Rank>& ranks, bool flight_records,
                                 DeadlineVerdict verdict, double since_progress, const ProgressWatch& progress) {
  const auto records = flight_records ? FlightRecords(directory, ranks.size())
                                      : std::vector<std::vector<pipeline::FlightEntry>>(ranks.size());
  std::vector<std::string> stuck, doing, outputs;
  for (const auto& rank : ranks) {
    if (!rank.killed_here) continue;
    stuck.push_back(std::to_string(rank.rank));
    if (flight_records) {
      doing.push_back(fmt::format("{} {}", ProcessName(scenario, rank.rank),
                                  pipeline::DescribeLastEntry(records[rank.rank], progress.Computing(rank.rank))));
    }
    outputs.push_back(fmt::format("rank {}: {}", rank.rank, Tail(rank.log, 1)));
  }
  const std::string who = flight_records ? "" : fmt::format("trainer {}: ", scenario.trainer);
  auto report = FailedScenarioReport(
      scenario, reports::Status::kTimeout,
      fmt::format("{}rank(s) {} still running after the {:g} s deadline, {}{}{}; last output: {}", who,
                  fmt::join(stuck, ", "), options.timeout_seconds,
                  verdict == DeadlineVerdict::kOverCap
                      ? fmt::format("still making progress at {:g} times it (too slow, not hung)", kDeadlineCap)
                      : fmt::format("none of them making progress for {:.1f} s (hung)", since_progress),
                  doing.empty() ? "" : ": ", fmt::join(doing, "; "), fmt::join(outputs, " || ")));
  if (flight_records) AttachPartialTimeline(report, scenario.name, records);
  return report;
}

// The report a single process left in result.json once every process exited cleanly.
reports::ScenarioReport Delivered(const scenarios::Scenario& scenario, const fs::path& result_path, const Rank& writer) {
  std::ifstream stream(result_path);
  if (!stream) {
    return FailedScenarioReport(scenario, reports::Status::kError,
                                fmt::format("every rank exited cleanly but rank 0 wrote no result; its last output: {}",
                                            Tail(writer.log)));
  }
  std::stringstream text;
  text << stream.rdbuf();
  return reports::FromJson(text.str());
}

// The processes of one phase of a scenario, watched together until they all exit (nullopt) or
// one fails, the deadline passes or an interrupt arrives (the report saying so).
struct Group {
  const scenarios::Scenario& scenario;
  std::string plan;  // the plan file every worker of the scenario reads
  const LaunchOptions& options;
  fs::path directory;
  fs::path result_path;  // the file rank 0 writes its verdict to; empty when none of them does
  bool flight_records = true;  // pipecheck's own ranks: their timelines tell where they stopped
  std::chrono::steady_clock::time_point start;  // the scenario's: its deadline counts from here
};

std::optional<reports::ScenarioReport> Watch(const Group& group, std::vector<Rank>& ranks, bool& port_busy) {
  const auto& scenario = group.scenario;
  const auto& options = group.options;
  auto next_progress = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.progress_seconds);
  std::string last_progress;
  ProgressWatch progress(group.directory, ranks.size(), group.flight_records);
  while (true) {
    if (g_interrupt_signal != 0) {
      KillAndReap(ranks);
      throw Interrupted{g_interrupt_signal};
    }
    bool any_running = false;
    for (auto& rank : ranks) {
      if (rank.running && waitpid(rank.pid, &rank.status, WNOHANG) == rank.pid) rank.running = false;
      any_running = any_running || rank.running;
    }
    const bool result_written = !group.result_path.empty() && fs::exists(group.result_path);
    if (std::any_of(ranks.begin(), ranks.end(), [&](const Rank& r) { return Failed(r, result_written); })) {
      auto report = BlameFailedRank(scenario, ranks, result_written, group.flight_records ? &group.directory : nullptr);
      // LibTorch 1.13 says "Address already in use", 2.x "EADDRINUSE ... address already in use".
      port_busy = report.summary.message.find("ddress already in use") != std::string::npos;
      return report;
    }
    if (!any_running) return std::nullopt;
    if (options.progress && std::chrono::steady_clock::now() > next_progress) {
      next_progress += std::chrono::duration<double>(options.progress_seconds);
      std::string line;  // from the rank of the last stage, the only one that writes progress
      for (const auto& rank : ranks) {
        if (line.empty()) line = LastProgress(rank.log);
      }
      if (!line.empty() && line != last_progress) options.progress(line);
      last_progress = line;
    }
    // Sampled from the start, so that the deadline finds a recent picture.
    const double since_progress = progress.SinceProgress(ranks);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - group.start).count();
    const auto verdict = JudgeDeadline(elapsed, since_progress, options.timeout_seconds);
    if (verdict != DeadlineVerdict::kRunning) {
      KillAndReap(ranks);
      return TimedOut(scenario, options, group.directory, ranks, group.flight_records, verdict, since_progress,
                      progress);
    }
    // Not faster: on a machine with as many cores as ranks every wakeup takes a core from a rank.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// `count` processes, process r running command(r) as rank r of `count`, logging to log(r).
std::vector<Rank> Spawn(const scenarios::Scenario& scenario, const LaunchOptions& options, int count, int port,
                        const std::function<ProcessCommand(int)>& command,
                        const std::function<std::string(int)>& log) {
  std::vector<Rank> ranks;
  for (int r = 0; r < count; ++r) {
    Rank rank;
    rank.rank = r;
    rank.log = log(r);
    rank.pid = SpawnRank(scenario, options, command(r), r, count, port, rank.log);
    ranks.push_back(rank);
  }
  return ranks;
}

// Another trainer's scenario (external.h): a worker writes its inputs, the trainer's ranks train,
// a worker judges what they handed back. A failure in any phase fails the scenario there.
reports::ScenarioReport AttemptExternal(const Group& group, int port, bool& port_busy) {
  const auto& scenario = group.scenario;
  const std::string directory = group.directory.string();
  Group single = group;
  single.flight_records = false;
  single.result_path.clear();
  auto prepare = Spawn(scenario, group.options, 1, port, [&](int) { return WorkerCommand(scenario, group.options, group.plan, directory, "prepare"); },
                       [&](int) { return (group.directory / "prepare.log").string(); });
  if (auto failed = Watch(single, prepare, port_busy)) {
    failed->summary.message = "preparing the trainer's inputs: " + failed->summary.message;
    return *failed;
  }
  const ProcessCommand trainer{TrainerCommand(scenario),
                               TrainerEnvironment(scenario, directory, group.options.threads_per_rank),
                               TrainerPreload(scenario)};
  auto ranks = Spawn(scenario, group.options, static_cast<int>(scenario.Processes()), port,
                     [&](int) { return trainer; },
                     [&](int r) { return (group.directory / fmt::format("rank{}.log", r)).string(); });
  if (auto failed = Watch(single, ranks, port_busy)) {
    if (failed->summary.status == reports::Status::kError) {
      failed->summary.message = fmt::format("trainer {}: {}", scenario.trainer, failed->summary.message);
    }
    return *failed;
  }
  single.result_path = group.result_path;
  auto judge = Spawn(scenario, group.options, 1, port, [&](int) { return WorkerCommand(scenario, group.options, group.plan, directory, "judge"); },
                     [&](int) { return (group.directory / "judge.log").string(); });
  if (auto failed = Watch(single, judge, port_busy)) return *failed;
  return Delivered(scenario, group.result_path, judge.front());
}

// One attempt at the scenario on `port`; sets `port_busy` when rank 0 could not listen on it.
reports::ScenarioReport Attempt(const Plan& plan, const LaunchOptions& options, int port, bool& port_busy) {
  const auto& scenario = plan.scenario;
  const fs::path directory = fs::path(options.work_directory) / scenario.name / options.subdirectory;
  fs::create_directories(directory);
  const fs::path result_path = directory / kResultFile;
  fs::remove(result_path);
  for (int r = 0; r < scenario.Processes(); ++r) fs::remove(FlightRecordPath(directory.string(), r));
  const std::string plan_path = (directory / kPlanFile).string();
  WritePlan(plan, plan_path);
  const Group group{scenario, plan_path, options, directory, result_path, true, std::chrono::steady_clock::now()};
  if (scenario.ExternalTrainer()) return AttemptExternal(group, port, port_busy);
  auto ranks = Spawn(scenario, options, static_cast<int>(scenario.Processes()), port,
                     [&](int) { return WorkerCommand(scenario, options, plan_path, directory.string()); },
                     [&](int r) { return (directory / fmt::format("rank{}.log", r)).string(); });
  if (auto failed = Watch(group, ranks, port_busy)) return *failed;
  return Delivered(scenario, result_path, ranks.front());
}

}  // namespace

reports::ScenarioReport LaunchScenario(const Plan& plan, const LaunchOptions& options) {
  if (!plan.error.empty()) return FailedScenarioReport(plan.scenario, reports::Status::kError, plan.error, plan.transport);
  // A port found free can be taken before rank 0 listens on it; then try another.
  constexpr int kAttempts = 3;
  int port = options.port > 0 ? options.port : FreeLoopbackPort();
  for (int attempt = 1;; ++attempt) {
    bool port_busy = false;
    auto report = Attempt(plan, options, port, port_busy);
    // What ran is the plan's, whoever wrote the row (rank 0, or this launcher for a failed rank).
    report.summary.transport = plan.scenario.ExternalTrainer() ? "" : plan.transport;
    if (!port_busy || attempt == kAttempts || plan.scenario.Processes() == 1) return report;
    port = FreeLoopbackPort();
  }
}

reports::ScenarioReport LaunchResumed(const scenarios::Scenario& scenario, const LaunchOptions& options,
                                      double timeout_seconds, int threads_per_rank) {
  const std::string folder = (fs::path(options.work_directory) / scenario.name).string();
  const auto stretches = StretchesOf(scenario, folder);
  std::vector<reports::ScenarioReport> reports;
  for (const auto& stretch : stretches) {
    Plan plan = ResolvePlan(stretch.scenario);
    plan.segment = stretch.segment;
    ApplySegment(plan);
    if (!plan.unmet.empty()) {
      return FailedScenarioReport(scenario, reports::Status::kSkipped,
                                  fmt::format("layout {}: {}", stretch.segment.index, plan.unmet), plan.transport);
    }
    // Nothing an earlier run of this row left may stand in for what this run writes.
    if (!stretch.segment.save_checkpoint.empty()) fs::remove_all(stretch.segment.save_checkpoint);
    if (!stretch.segment.judge_state_out.empty()) fs::remove(stretch.segment.judge_state_out);
    auto launch = options;
    launch.timeout_seconds = timeout_seconds > 0 ? timeout_seconds : plan.deadline_seconds;
    launch.threads_per_rank = threads_per_rank > 0
                                  ? threads_per_rank
                                  : std::max(1, UsableCores() / static_cast<int>(stretch.scenario.Processes()));
    launch.subdirectory = fmt::format("layout{}", stretch.segment.index);
    if (stretch.segment.index + 1 < stretch.segment.count) {
      // The row's speed is its last layout's: the others take no timing-only steps.
      launch.timed_steps = 0;
      launch.timed_steps_given = true;
    }
    reports.push_back(LaunchScenario(plan, launch));
    // A stretch that ran to its end (passing or failing) wrote its checkpoint; one that did not
    // leaves nothing the next could load.
    const auto status = reports.back().summary.status;
    if (status != reports::Status::kPass && status != reports::Status::kFail) break;
  }
  return MergeStretches(scenario, stretches, reports);
}

reports::ScenarioReport LaunchScenario(const scenarios::Scenario& scenario, const LaunchOptions& options) {
  if (!scenario.resumes.empty()) return LaunchResumed(scenario, options, options.timeout_seconds, options.threads_per_rank);
  return LaunchScenario(ResolvePlan(scenario), options);
}

}  // namespace pipecheck::harness
