// Everything pipecheck knows per parameter dtype, in one table: its name in scenario files and
// reports, the tolerances a row may set, the judges' gradient floor, and how it computes.
#pragma once

#include <string>
#include <vector>

namespace pipecheck::scenarios {

struct DtypeTraits {
  std::string name;  // as the `dtype` column, PyTorch and every report spell it
  int bytes = 0;     // per element
  // `tol`: the default, and the loosest a row may set. Correct pipelines measure far below these
  // (float64 ~1e-15, float32 ~1e-6, bfloat16 ~6e-3); the injected bugs move gradients by 8e-2 and
  // more, which a looser tol could hide.
  double default_tol = 0.0;
  double max_tol = 0.0;
  // The judges' floor on a gradient's norm, as a fraction of the step's whole gradient norm (see
  // harness/parity.h): float64 1e-5, float32 1e-3, bfloat16 3e-3. Measured noise on analytically
  // zero gradients (gpt2 key biases) reached 1.5e-9 of the global norm in float32 after 16 AdamW
  // steps at lr 1e-2 (scenarios/long.csv), which a 1e-5 floor wrongly failed.
  double floor_fraction = 0.0;
  // Lower precision than the optimizer's float32: gradients are summed over microbatches in
  // float32 beside the parameters (the float32-sums judge), and another trainer may keep float32
  // master weights.
  bool reduced = false;
  // The same arithmetic gives the same bits on the CPU, so invariance asserts bitwise equality.
  bool bitwise_on_cpu = false;
};

// The dtypes a scenario may name, the default (float64) first.
const std::vector<DtypeTraits>& Dtypes();
// The traits of `name`; std::invalid_argument naming the known dtypes for any other.
const DtypeTraits& DtypeOf(const std::string& name);
// The names of Dtypes(), in order.
std::vector<std::string> DtypeNames();

}  // namespace pipecheck::scenarios
