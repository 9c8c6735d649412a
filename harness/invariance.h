// `pipecheck invariance`: one scenario run as many pipelines (other world sizes, partitions,
// schedules; microbatch counts on request), each as real ranks with full parity against the
// reference, then every pair of variants (and the reference) compared on every step's loss and
// applied gradients and on the final weights. Where two variants do the same arithmetic in the
// same order (ArithmeticKey equal), float64 on the CPU must agree to the last bit, and the matrix
// says which pairs those are; elsewhere it records how far rounding took them apart.
//
// What decides the arithmetic (ArithmeticOf), from how the trainers compute:
//  - the microbatch split: each microbatch's rows and padded length (its matmuls' shapes);
//  - per model unit (embedding, each layer, head), the order in which its stage's B or W actions
//    add the microbatches' gradients into .grad;
//  - the order in which the last stage sums the microbatches' loss terms;
//  - a tied weight: both uses summed inside one stage's backward (a single stage holds the whole
//    model) or each copy accumulated on its own and the two sums added after the last backward;
//  - with clipping: how the squared norms are grouped, one partial sum per rank over its units in
//    order, then over ranks in rank order;
//  - the device and dtype, with the same intra-op threads in every variant.
//  - the replicas (data_parallel): each sums its own microbatches, then the replicas' sums are
//    added (each replica's loss already over the whole batch's tokens);
// Where a layer runs, how many ranks there are, empty stages, the transport and recomputation
// change none of these: a layer's arithmetic on a microbatch is the same wherever it runs, and
// float64 messages carry their bits unchanged. That is the claim the bitwise assertion tests.
// Not asserted: float32 and bfloat16 (reported only), and CUDA (its embedding backward adds with
// atomics, whose order is not fixed).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "pipeline/rank_result.h"
#include "reference/trainer.h"
#include "scenarios/scenario.h"

namespace pipecheck::harness {

struct InvarianceOptions {
  std::string scenarios_path;
  std::string out;
  bool full = false;  // the cross product of world sizes x partitions x schedules; else one axis at a time
  std::vector<int64_t> world_sizes;   // empty: 1..max(4, the scenario's)
  std::vector<int64_t> microbatches;  // further microbatch counts (each changes the arithmetic)
  std::vector<int64_t> data_parallel; // replica counts to try (empty: 1 and 2); recompute is always tried both ways
  int threads = 1;                    // intra-op threads per rank, the same in every variant
  double timeout_seconds = 0.0;       // per variant; 0: sized to it
};

// One pipeline to run: the scenario with some settings changed.
struct Variant {
  scenarios::Scenario scenario;  // named BASE.LABEL
  std::string label;             // "ws2.1f1b.uniform", "ws4.zbv.v2.back"
  std::string axis;              // base, world_size, partition, schedule, microbatches, full
};

// A variant that cannot run, and why (the loader's own message).
struct SkippedVariant {
  std::string label;
  std::string reason;
};

// The variants of `base` (the base itself first), valid ones only; the rest go to `skipped`.
// Variants that resolve to the same pipeline (same stage layer counts, schedule, sizes) appear once.
std::vector<Variant> InvarianceVariants(const scenarios::Scenario& base, const InvarianceOptions& options,
                                        std::vector<SkippedVariant>* skipped);

// The order of arithmetic a trainer runs for a scenario (see the header comment).
struct ArithmeticKey {
  std::string device;
  std::string dtype;
  int64_t microbatches = 1;   // of the global batch (data_parallel x each replica's)
  int64_t data_parallel = 1;  // replicas whose sums are added
  std::vector<std::pair<std::string, std::vector<int>>> accumulation;  // unit -> microbatch order (per replica)
  std::vector<int> loss_order;
  bool tied_in_one_stage = false;  // only meaningful when tied
  bool tied = false;
  std::vector<std::vector<std::string>> norm_groups;  // per rank with units, its units; empty without clipping
};

ArithmeticKey ArithmeticOf(const scenarios::Scenario& scenario);
// The reference: the whole batch in one pass on one module.
ArithmeticKey ReferenceArithmetic(const scenarios::Scenario& scenario);
// The first way `a` and `b` differ in arithmetic, in words; "" when they do the same.
std::string ArithmeticDifference(const ArithmeticKey& a, const ArithmeticKey& b);

// What one run produced: per step the loss and the applied gradients (by parameter name, one
// entry per parameter however many copies ranks hold), and the final weights.
struct TrainedTensors {
  std::vector<double> losses;
  std::vector<reference::NamedTensors> gradients;
  reference::NamedTensors final_weights;
};

TrainedTensors FromRanks(const std::vector<pipeline::RankResult>& ranks);
TrainedTensors FromReference(const reference::TrainResult& result);
// tensors.pt: a name -> tensor dict Python's torch.load reads ("loss/S", "grad/S/NAME", "final/NAME").
void SaveTrainedTensors(const TrainedTensors& tensors, const std::string& path);
TrainedTensors LoadTrainedTensors(const std::string& path);
constexpr const char* kTensorsFile = "tensors.pt";

// One pair's comparison.
struct PairComparison {
  bool bitwise = false;             // every loss, gradient and final weight has the same bits
  double loss_max_abs_diff = 0.0;
  double grad_max_abs_diff = 0.0;
  double grad_max_rel_err = 0.0;    // ||a - b|| / max(||b||, floor), the parity measure
  std::string worst_param;          // "step S NAME"
  double weights_max_abs_diff = 0.0;
  std::string first_difference;     // the first loss or tensor whose bits differ: "step S NAME", "final NAME"
  std::string problem;              // steps or parameters that do not correspond; "" when they do
};

// `floor_fraction`: of the step's whole gradient norm, as parity uses (DtypeTraits::floor_fraction).
PairComparison CompareTrained(const TrainedTensors& a, const TrainedTensors& b, double floor_fraction);

// invariance.csv's columns.
const std::vector<std::string>& InvarianceColumns();

// The matrix, built from what the runs left, with no rank involved: one entry per run (the
// reference first), every pair compared once.
struct MatrixEntry {
  std::string label;
  ArithmeticKey key;
  TrainedTensors tensors;
};

struct MatrixPair {
  size_t a = 0, b = 0;           // entries, a < b
  bool same_arithmetic = false;
  std::string difference;        // how the arithmetic differs, in words ("" when the same)
  bool asserted = false;         // bitwise equality is required of this pair
  bool ok = true;                // not asserted, or bitwise equal
  PairComparison comparison;
};

struct InvarianceMatrix {
  std::vector<std::string> labels;            // per entry
  std::vector<MatrixPair> pairs;              // (0, 1), (0, 2), ... (1, 2), ...
  std::vector<std::vector<size_t>> classes;   // entries with the same arithmetic in the same order
  int asserted = 0, bitwise = 0, broken = 0;  // pairs asserted, bitwise equal, asserted but not bitwise
};

// `assert_bitwise`: whether the same arithmetic must give the same bits (float64 on the CPU).
InvarianceMatrix BuildMatrix(const std::vector<MatrixEntry>& entries, double floor_fraction, bool assert_bitwise);
// invariance.csv: a row per pair.
std::string InvarianceCsv(const std::string& scenario, const InvarianceMatrix& matrix);
// The console's matrix: a legend, the grid of cells, the classes, and the pairs not bitwise.
void PrintMatrix(std::ostream& out, const InvarianceMatrix& matrix);

// Exit code: 0 when every variant passed parity and every asserted pair is bitwise equal, 1
// otherwise, 128 + signal when interrupted.
int RunInvariance(const scenarios::Scenario& base, const InvarianceOptions& options, std::ostream& out);

}  // namespace pipecheck::harness
