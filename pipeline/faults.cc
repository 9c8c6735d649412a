// Fault names (see faults.h).
#include "pipeline/faults.h"

#include <stdexcept>

namespace pipecheck::pipeline {

const std::vector<std::string>& FaultNames() {
  static const std::vector<std::string> names = {
      "none",           "detach_input",   "mean_of_microbatch_means", "grad_scale_per_microbatch",
      "zero_grad_per_microbatch", "drop_microbatch", "local_clip",    "tied_norm_twice",
      "skip_tied_sync", "stale_shape",    "optimizer_state_reset",    "send_before_recv",
      "crash_rank",     "hang_rank",      "clip_before_tied_sync",    "double_grad_scaling",
      "send_buffer_reuse"};
  return names;
}

Fault ParseFault(const std::string& name) {
  const auto& names = FaultNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Fault>(i);
  }
  throw std::invalid_argument("unknown fault '" + name + "'");
}

}  // namespace pipecheck::pipeline
