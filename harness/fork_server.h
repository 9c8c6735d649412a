// A fork server for pipecheck's own ranks.
//
// Starting a rank by exec costs this binary's start-up every time: on the 2-core CPU machine the
// docs measure, 0.57 s of CPU to load and relocate LibTorch and its CUDA libraries, more than a
// tiny scenario's whole training. A run therefore forks, first thing in main and before any thread,
// CUDA context or OpenMP pool exists, a small server process that already has every library loaded
// and initialised. Each rank is then a fork of that server calling the same `pipecheck worker`
// entry point with the same argv an exec would have had: nothing the launcher did since start-up
// (threads, the reference's OpenMP pool, open files) leaks into a rank.
//
// The rank is made a child of the launcher (the launcher is the child subreaper while it spawns,
// and the server double-forks), so that the launcher waits for, times, samples and kills it
// exactly as it would an exec'd rank. A rank dies with the launcher (SIGKILL on its death).
//
// A Python trainer's ranks on the CPU get the same from a Python server (trainers/fork_server.py):
// one per run, interpreter and trainer, started at the trainer's first rank, that has imported the
// trainer's framework once (2 to 6 s of CPU a rank otherwise) and forks each rank from there, by the
// same requests, double fork and signals. It serves only while it is a single thread after those
// imports.
//
// Anything a server cannot start falls back to fork and exec; PIPECHECK_SPAWN=exec forces that.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pipecheck::harness {

// What a rank is started with: what fork and exec would have given it.
struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is this executable
  std::vector<std::pair<std::string, std::string>> environment;  // set before the entry point runs
  std::string log;  // stdout and stderr go here (created, truncated)
  std::vector<int> cpus;  // its CPU affinity; empty: inherited
  std::string bound_line;  // written to the log first when cpus was applied
};

// Forks the server, which serves until this process exits or StopForkServer is called. `entry`
// is what a rank runs (main's own command line dispatch); its return value is the rank's exit
// code. Call before any thread exists. Does nothing when PIPECHECK_SPAWN=exec, or on failure.
void StartForkServer(std::function<int(int, char**)> entry);

// Ends the server (idempotent).
void StopForkServer();

// Ends a rank's process with `code` once its output is flushed, skipping static destructors.
[[noreturn]] void EndRank(int code);

// A rank started by the server, a child of this process; nullopt when no server runs (the
// caller forks and execs instead).
std::optional<pid_t> ForkServerSpawn(const SpawnRequest& request);

// A rank of a Python trainer (request.argv: `python`, the trainer's script, its arguments) forked
// by the Python fork server `server_script` that has run `preload` in `python`, a child of this
// process; the server is started at the first such request. nullopt when PIPECHECK_SPAWN=exec or
// no server can serve (it failed to start, its preload failed, or it has more than one thread
// after it): the caller forks and execs instead.
std::optional<pid_t> PythonForkServerSpawn(const std::string& server_script, const std::string& preload,
                                           const SpawnRequest& request);

}  // namespace pipecheck::harness
