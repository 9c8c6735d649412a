// The c10d API we use, kept in one place: how a Gloo group and a TCP store are made and what a
// pending operation's handle is called. c10d is not a stable API (its Options, Backend and
// Store constructors change between 2.x releases); a version difference goes here, nowhere else.
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
