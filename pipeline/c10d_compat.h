// LibTorch 1.13 / 2.x differences in the c10d API we use, kept in one place. Both versions
// build ProcessGroupGloo from (store, rank, size, options) and share send/recv/allgather
// signatures; what differs is the base class (ProcessGroup in 1.13, Backend in 2.x) and the
// Work handle's spelling, which the aliases below hide.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>

namespace pipecheck::compat {

using GlooGroup = c10::intrusive_ptr<c10d::ProcessGroupGloo>;
using WorkHandle = c10::intrusive_ptr<c10d::Work>;

// A Gloo process group over `store`; `interface_host` picks the network device ("127.0.0.1"
// for loopback runs, the node's hostname otherwise).
inline GlooGroup MakeGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               const std::string& interface_host, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(interface_host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                                    : c10d::ProcessGroupGloo::createDeviceForHostname(interface_host));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

inline c10::intrusive_ptr<c10d::Store> MakeTcpStore(const std::string& host, uint16_t port, bool is_server,
                                                   int world_size, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = is_server;
  options.numWorkers = world_size;
  options.waitWorkers = false;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

}  // namespace pipecheck::compat
