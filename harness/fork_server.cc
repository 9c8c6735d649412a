// The fork server (see fork_server.h).
#include "harness/fork_server.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pipecheck::harness {
namespace {

// The signals a launcher handles or that a terminal sends its process group. The server ignores
// them (the launcher ends it); a rank gets back what the launcher had at start-up, as exec would
// have given it (a handled signal is reset to its default there, an ignored one stays ignored).
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};

struct Server {
  std::mutex mutex;
  int fd = -1;     // the launcher's end of the request socket
  pid_t pid = -1;  // the server
  // The Python server's rank waits for a go-ahead the launcher sends once it has the rank's pid, so
  // that a reply lost (a timeout, a signal) cannot leave a rank running beside its exec'd stand-in.
  bool go_ahead = false;
};

Server& TheServer() {
  static Server* server = new Server;  // never destroyed: StopForkServer runs at exit
  return *server;
}

// Requests travel as one datagram: strings, each a 32-bit length and its bytes.
void Put(std::string& out, const std::string& text) {
  const uint32_t length = static_cast<uint32_t>(text.size());
  out.append(reinterpret_cast<const char*>(&length), sizeof(length));
  out.append(text);
}

struct Reader {
  const char* at;
  const char* end;
  bool ok = true;
  std::string Next() {
    uint32_t length = 0;
    if (!ok || end - at < static_cast<std::ptrdiff_t>(sizeof(length))) return Fail();
    std::memcpy(&length, at, sizeof(length));
    at += sizeof(length);
    if (end - at < static_cast<std::ptrdiff_t>(length)) return Fail();
    std::string text(at, length);
    at += length;
    return text;
  }
  size_t Count() { return static_cast<size_t>(std::strtoul(Next().c_str(), nullptr, 10)); }
  std::string Fail() {
    ok = false;
    return "";
  }
};

std::string Encode(const SpawnRequest& request) {
  std::string out;
  Put(out, std::to_string(request.argv.size()));
  for (const auto& arg : request.argv) Put(out, arg);
  Put(out, std::to_string(request.environment.size()));
  for (const auto& [name, value] : request.environment) {
    Put(out, name);
    Put(out, value);
  }
  Put(out, request.log);
  Put(out, std::to_string(request.cpus.size()));
  for (int cpu : request.cpus) Put(out, std::to_string(cpu));
  Put(out, request.bound_line);
  return out;
}

bool Decode(const char* data, size_t size, SpawnRequest& request) {
  Reader in{data, data + size};
  request.argv.resize(in.Count());
  for (auto& arg : request.argv) arg = in.Next();
  request.environment.resize(in.Count());
  for (auto& [name, value] : request.environment) {
    name = in.Next();
    value = in.Next();
  }
  request.log = in.Next();
  request.cpus.resize(in.Count());
  for (int& cpu : request.cpus) cpu = std::atoi(in.Next().c_str());
  request.bound_line = in.Next();
  return in.ok && !request.argv.empty();
}

// In the rank: become what fork and exec would have made, then run the entry point.
[[noreturn]] void BecomeRank(const SpawnRequest& request, pid_t launcher, const struct sigaction* saved,
                             const std::function<int(int, char**)>& entry) {
  // The middle process exits at once and this one becomes the launcher's child; then die with it.
  for (int waited = 0; getppid() != launcher; ++waited) {
    if (waited > 20000) _exit(126);  // 2 s: the launcher is gone, or not the subreaper
    usleep(100);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(126);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction action = saved[i];
    if (action.sa_handler != SIG_IGN) {
      action.sa_handler = SIG_DFL;
      action.sa_flags = 0;
    }
    sigaction(kSignals[i], &action, nullptr);
  }
  const int fd = open(request.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  if (!request.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : request.cpus) CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) == 0) {
      (void)!write(STDERR_FILENO, request.bound_line.data(), request.bound_line.size());
    }
  }
  for (const auto& [name, value] : request.environment) setenv(name.c_str(), value.c_str(), 1);
  std::vector<std::string> strings = request.argv;
  std::vector<char*> argv;
  for (auto& arg : strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  EndRank(entry(static_cast<int>(strings.size()), argv.data()));
}

// The server: one request, one rank, one reply (the rank's pid, or minus an errno), until the
// launcher closes its end.
[[noreturn]] void Serve(int fd, pid_t launcher, const std::function<int(int, char**)>& entry) {
  struct sigaction saved[std::size(kSignals)];
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(kSignals[i], &ignore, &saved[i]);
  }
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t size = recv(fd, buffer.data(), buffer.size(), 0);
    if (size <= 0) _exit(0);
    SpawnRequest request;
    int64_t reply = -EINVAL;
    int link[2];
    if (!Decode(buffer.data(), static_cast<size_t>(size), request)) {
      reply = -EINVAL;
    } else if (pipe2(link, O_CLOEXEC) != 0) {
      reply = -errno;
    } else {
      const pid_t middle = fork();
      if (middle == 0) {
        close(link[0]);
        const pid_t rank = fork();
        if (rank == 0) {
          close(link[1]);
          close(fd);
          BecomeRank(request, launcher, saved, entry);
        }
        const int64_t pid = rank < 0 ? -errno : rank;
        (void)!write(link[1], &pid, sizeof(pid));
        _exit(0);
      }
      close(link[1]);
      if (middle < 0) {
        reply = -errno;
      } else {
        if (read(link[0], &reply, sizeof(reply)) != static_cast<ssize_t>(sizeof(reply))) reply = -EPIPE;
        waitpid(middle, nullptr, 0);  // after which the rank is the launcher's child
      }
      close(link[0]);
    }
    if (send(fd, &reply, sizeof(reply), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(reply))) _exit(0);
  }
}

void StopLocked(Server& server) {
  if (server.fd >= 0) close(server.fd);
  server.fd = -1;
  if (server.pid > 0) {
    kill(server.pid, SIGKILL);
    waitpid(server.pid, nullptr, 0);
  }
  server.pid = -1;
}

// The launcher's side of a server just forked (`pid`, the socket pair `fds`, whose first end
// stays here): keeps it, or closes the pair where the fork failed. Whether the server runs.
bool AdoptServer(Server& server, const int fds[2], pid_t pid) {
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return false;
  }
  server.fd = fds[0];
  server.pid = pid;
  return true;
}

// Hands `request` to `server` (its mutex held) and returns the rank it started, now this
// process's child; nullopt when it did not (a server that stopped answering is stopped).
std::optional<pid_t> Exchange(Server& server, const SpawnRequest& request) {
  if (server.fd < 0) return std::nullopt;
  // The rank is reparented to this process when the server's middle process exits: only to a
  // child subreaper (else to init, and this process could not wait for it).
  int was_subreaper = 0;
  prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper);
  if (!was_subreaper && prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return std::nullopt;
  const std::string message = Encode(request);
  int64_t reply = 0;
  const bool exchanged = send(server.fd, message.data(), message.size(), MSG_NOSIGNAL) ==
                             static_cast<ssize_t>(message.size()) &&
                         recv(server.fd, &reply, sizeof(reply), 0) == static_cast<ssize_t>(sizeof(reply));
  if (!was_subreaper) prctl(PR_SET_CHILD_SUBREAPER, 0);
  if (!exchanged) {
    StopLocked(server);  // a server that stopped answering starts nothing more
    return std::nullopt;
  }
  if (reply <= 0) return std::nullopt;
  const pid_t pid = static_cast<pid_t>(reply);
  // It must be this process's child by now; otherwise it cannot be waited for: end it.
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    kill(pid, SIGKILL);
    const char no = 0;  // a Python server waits for the word either way
    if (server.go_ahead) (void)send(server.fd, &no, sizeof(no), MSG_NOSIGNAL);
    return std::nullopt;
  }
  const char go = 1;
  if (server.go_ahead && send(server.fd, &go, sizeof(go), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(go))) {
    kill(pid, SIGKILL);  // it never ran the trainer
    waitpid(pid, nullptr, 0);
    StopLocked(server);
    return std::nullopt;
  }
  return pid;
}

// The Python servers of this run, by interpreter and preload; a server that could not serve
// stays in the map stopped (fd -1), so that it is not started again.
struct PythonServers {
  std::mutex mutex;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Server>> servers;
};

PythonServers& ThePythonServers() {
  static PythonServers* servers = new PythonServers;  // never destroyed: StopForkServer runs at exit
  return *servers;
}

// How long a Python server may take to import its framework (minutes on a loaded machine), and
// then to answer a request, before it is given up for fork and exec.
constexpr int kPythonReadySeconds = 300;
constexpr int kPythonReplySeconds = 60;

void ReceiveTimeout(int fd, int seconds) {
  struct timeval timeout {};
  timeout.tv_sec = seconds;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
}

// Starts `python server_script FD LAUNCHER PRELOAD` on one end of a socket pair (its fd 3) and
// waits for its word that it serves; leaves `server` stopped otherwise. The server's environment
// is this process's with the first rank's on top: what a process reads only as it starts (glibc's
// allocator settings, the interpreter's own) is then what an exec'd rank would have had, every
// rank being handed the same variables (each rank sets its own values again).
void StartPythonServer(Server& server, const SpawnRequest& first, const std::string& server_script,
                       const std::string& preload) {
  constexpr int kServerFd = 3;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return;
  const pid_t launcher = getpid();
  // Everything the child needs, made before fork: between fork and exec it only makes system calls.
  std::vector<std::string> strings = {first.argv.front(), "-u", server_script, std::to_string(kServerFd),
                                      std::to_string(launcher), preload};
  std::vector<char*> argv;
  for (auto& text : strings) argv.push_back(text.data());
  argv.push_back(nullptr);
  std::vector<std::string> variables;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    const std::string name = variable.substr(0, variable.find('='));
    const bool replaced = std::any_of(first.environment.begin(), first.environment.end(),
                                      [&](const auto& pair) { return pair.first == name; });
    if (!replaced) variables.push_back(variable);
  }
  for (const auto& [name, value] : first.environment) variables.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& variable : variables) envp.push_back(variable.data());
  envp.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(0);
    // What the imports print is not any rank's: each rank writes its own log.
    const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
    }
    if (fds[1] == kServerFd) {
      fcntl(kServerFd, F_SETFD, 0);
    } else if (dup2(fds[1], kServerFd) != kServerFd) {
      _exit(127);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (!AdoptServer(server, fds, pid)) return;
  server.go_ahead = true;
  ReceiveTimeout(server.fd, kPythonReadySeconds);
  int64_t ready = -1;
  if (recv(server.fd, &ready, sizeof(ready), 0) != static_cast<ssize_t>(sizeof(ready)) || ready != 0) {
    StopLocked(server);
    return;
  }
  ReceiveTimeout(server.fd, kPythonReplySeconds);
}

}  // namespace

void EndRank(int code) {
  std::fflush(nullptr);
  _exit(code);
}

void StartForkServer(std::function<int(int, char**)> entry) {
  const char* mode = std::getenv("PIPECHECK_SPAWN");
  if (mode != nullptr && std::strcmp(mode, "exec") == 0) return;
  Server& server = TheServer();
  std::lock_guard<std::mutex> lock(server.mutex);
  if (server.fd >= 0) return;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return;
  const pid_t launcher = getpid();
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(0);
    Serve(fds[1], launcher, entry);
  }
  if (!AdoptServer(server, fds, pid)) return;
  std::atexit(StopForkServer);
}

void StopForkServer() {
  {
    Server& server = TheServer();
    std::lock_guard<std::mutex> lock(server.mutex);
    StopLocked(server);
  }
  PythonServers& python = ThePythonServers();
  std::lock_guard<std::mutex> lock(python.mutex);
  for (auto& [key, server] : python.servers) StopLocked(*server);
}

std::optional<pid_t> ForkServerSpawn(const SpawnRequest& request) {
  Server& server = TheServer();
  std::lock_guard<std::mutex> lock(server.mutex);
  return Exchange(server, request);
}

std::optional<pid_t> PythonForkServerSpawn(const std::string& server_script, const std::string& preload,
                                           const SpawnRequest& request) {
  const char* mode = std::getenv("PIPECHECK_SPAWN");
  if ((mode != nullptr && std::strcmp(mode, "exec") == 0) || request.argv.size() < 2) return std::nullopt;
  PythonServers& servers = ThePythonServers();
  std::lock_guard<std::mutex> lock(servers.mutex);
  auto& server = servers.servers[{request.argv.front(), preload}];
  if (!server) {
    server = std::make_unique<Server>();
    StartPythonServer(*server, request, server_script, preload);
    static const bool registered = [] { return std::atexit(StopForkServer) == 0; }();
    (void)registered;
  }
  return Exchange(*server, request);
}

}  // namespace pipecheck::harness
