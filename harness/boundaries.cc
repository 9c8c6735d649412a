// The first-divergence judge (see boundaries.h).
#include "harness/boundaries.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "reports/report.h"

namespace pipecheck::harness {
namespace {

using pipeline::BoundaryRecord;
using pipeline::BoundaryRole;
using pipeline::Direction;
using pipeline::DirectionName;
using reference::Fingerprint;
using reports::FormatNumber;

const char* RoleName(BoundaryRole role) {
  switch (role) {
    case BoundaryRole::kSent: return "sent";
    case BoundaryRole::kReceived: return "received";
    case BoundaryRole::kHandedOver: return "handed_over";
  }
  return "?";
}

std::string Where(const BoundaryRecord& record, int rank) {
  switch (record.role) {
    case BoundaryRole::kSent: return fmt::format("as rank {} sent it to rank {}", rank, record.peer);
    case BoundaryRole::kReceived: return fmt::format("from rank {}", record.peer);
    case BoundaryRole::kHandedOver: return fmt::format("handed over on rank {}", rank);
  }
  return "";
}

// Where a boundary sits in one microbatch's data flow: activations into stages 1, 2, ..., then
// gradients back into stages S-2, ..., 0.
int FlowPosition(Direction direction, int stage, int stages) {
  return direction == Direction::kActivation ? stage : 2 * stages - 1 - stage;
}

// One wrong thing, ordered by where it shows first.
struct Finding {
  std::tuple<int, int, int> order;  // microbatch, flow position, kind (0 in flight, 1 consumed, 2 sent)
  Direction direction;
  int stage;
  int microbatch;
  std::string message;
};

class ReferenceBoundaries {
 public:
  ReferenceBoundaries(const BoundaryInput& input) : input_(input), cuts_(CutMicrobatches(input.batch, input.microbatches)) {}

  // The reference's fingerprint of a boundary; null where the reference has no such tensor.
  const Fingerprint* Find(Direction direction, int stage, int microbatch) {
    const auto key = std::make_tuple(direction, stage, microbatch);
    auto cached = cache_.find(key);
    if (cached != cache_.end()) return cached->second ? &*cached->second : nullptr;
    auto& slot = cache_[key];
    const int stages = static_cast<int>(input_.slices.size());
    const int entering = direction == Direction::kActivation ? stage : stage + 1;
    if (entering < 1 || entering >= stages || microbatch < 0 || microbatch >= static_cast<int>(cuts_.size())) {
      return nullptr;
    }
    auto tapped = input_.reference.boundaries.find(input_.slices[entering].first_layer);
    if (tapped == input_.reference.boundaries.end()) return nullptr;
    const auto& whole = direction == Direction::kActivation ? tapped->second.activation : tapped->second.gradient;
    if (!whole.defined()) return nullptr;
    const auto& cut = cuts_[microbatch];
    slot = reference::FingerprintOf(whole.narrow(0, cut.start, cut.size).narrow(1, 0, cut.time).contiguous());
    return &*slot;
  }

 private:
  const BoundaryInput& input_;
  std::vector<MicrobatchCut> cuts_;
  std::map<std::tuple<Direction, int, int>, std::optional<Fingerprint>> cache_;
};

}  // namespace

std::vector<MicrobatchCut> CutMicrobatches(const reference::Batch& batch, int64_t microbatches) {
  std::vector<MicrobatchCut> cuts;
  int64_t start = 0;
  for (int64_t size : reference::MicrobatchSizes(batch.size(), microbatches)) {
    cuts.push_back({start, size, batch.lengths.narrow(0, start, size).max().item<int64_t>()});
    start += size;
  }
  return cuts;
}

std::vector<int64_t> BoundaryLayers(const std::vector<reference::SliceSpec>& slices) {
  std::vector<int64_t> layers;
  for (size_t s = 1; s < slices.size(); ++s) layers.push_back(slices[s].first_layer);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

namespace {

// boundaries.csv's row for `record` of `rank`, against the reference's `expected` (none: the
// reference has no such boundary).
reports::BoundaryRow RowOf(const BoundaryInput& input, int rank, const BoundaryRecord& record,
                           const Fingerprint* expected, double error) {
  const Fingerprint none;
  const Fingerprint& want = expected ? *expected : none;
  reports::BoundaryRow row;
  row.scenario = input.scenario;
  row.step = static_cast<int64_t>(input.step);
  row.microbatch = record.microbatch;
  row.stage = record.stage;
  row.direction = DirectionName(record.direction);
  row.role = RoleName(record.role);
  row.rank = rank;
  if (record.peer >= 0) row.peer = record.peer;
  row.numel = record.fingerprint.numel;
  row.ref_norm = want.norm, row.pp_norm = record.fingerprint.norm;
  row.ref_sum = want.sum, row.pp_sum = record.fingerprint.sum;
  row.ref_max_abs = want.max_abs, row.pp_max_abs = record.fingerprint.max_abs;
  row.rel_err = error;
  if (expected && expected->hashed && record.fingerprint.hashed) {
    row.bitwise_equal = expected->hash == record.fingerprint.hash;
  }
  row.ok = error <= input.tol;
  return row;
}

// The first problem of a step: the earliest finding in data-flow order, and where the other
// direction first went wrong.
std::string FirstProblem(std::vector<Finding> findings) {
  std::sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) { return a.order < b.order; });
  const Finding& first = findings.front();
  std::string problem = first.message;
  for (const auto& other : findings) {
    if (other.direction == first.direction) continue;
    problem += fmt::format("; {} into stage {} first wrong at microbatch {}", DirectionName(other.direction),
                           other.stage, other.microbatch);
    break;
  }
  return problem;
}

}  // namespace

BoundaryVerdict JudgeBoundaries(const BoundaryInput& input) {
  BoundaryVerdict verdict;
  ReferenceBoundaries reference(input);
  const int stages = static_cast<int>(input.slices.size());
  std::vector<Finding> findings;
  std::map<std::tuple<Direction, int, int>, std::pair<int, const BoundaryRecord*>> sent;  // by message
  std::vector<std::pair<int, const BoundaryRecord*>> received;
  for (const auto& rank : input.ranks) {
    for (const auto& record : rank.boundaries) {
      if (record.step != static_cast<int64_t>(input.step)) continue;
      const Fingerprint* expected = reference.Find(record.direction, record.stage, record.microbatch);
      const double error = expected ? reference::FingerprintError(record.fingerprint, *expected)
                                     : std::numeric_limits<double>::infinity();
      const bool ok = error <= input.tol;
      verdict.rows.push_back(RowOf(input, rank.rank, record, expected, error));
      if (record.role == BoundaryRole::kSent) sent[{record.direction, record.stage, record.microbatch}] = {rank.rank, &record};
      if (record.role == BoundaryRole::kReceived) received.push_back({rank.rank, &record});
      if (ok) continue;
      const std::string against =
          expected ? fmt::format("{} here, {} in the reference", reference::Describe(record.fingerprint),
                                 reference::Describe(*expected))
                   : "the reference has no such boundary";
      findings.push_back({{record.microbatch, FlowPosition(record.direction, record.stage, stages),
                           record.role == BoundaryRole::kSent ? 2 : 1},
                          record.direction, record.stage, record.microbatch,
                          fmt::format("step {}, microbatch {}: {} into stage {} ({}) rel err {:.3g} > tol {:.3g} against "
                                      "the reference cut at the same layer ({})",
                                      input.step, record.microbatch, DirectionName(record.direction), record.stage,
                                      Where(record, rank.rank), error, input.tol, against)});
    }
  }
  // What arrived against what left: a transport or a buffer reused too early changes it in flight.
  for (const auto& [rank, record] : received) {
    auto source = sent.find({record->direction, record->stage, record->microbatch});
    if (source == sent.end()) continue;
    const BoundaryRecord& departed = *source->second.second;
    if (reference::SameBytes(departed.fingerprint, record->fingerprint, input.dtype)) continue;
    findings.push_back({{record->microbatch, FlowPosition(record->direction, record->stage, stages), 0},
                        record->direction, record->stage, record->microbatch,
                        fmt::format("step {}, microbatch {}: {} into stage {} changed between rank {}'s send and rank "
                                    "{}'s receive (sent: {}; received: {})",
                                    input.step, record->microbatch, DirectionName(record->direction), record->stage,
                                    source->second.first, rank, reference::Describe(departed.fingerprint),
                                    reference::Describe(record->fingerprint))});
  }
  if (!findings.empty()) verdict.first_problem = FirstProblem(std::move(findings));
  return verdict;
}

}  // namespace pipecheck::harness
