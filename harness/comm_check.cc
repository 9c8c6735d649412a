// The communication check (see comm_check.h).
#include "harness/comm_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "reference/dtype_name.h"
#include "pipeline/comm_record.h"
#include "reference/data.h"

namespace pipecheck::harness {
namespace {

using pipeline::MessageRecord;

bool SameMessage(const MessageRecord& a, const MessageRecord& b) {
  return a.send == b.send && a.peer == b.peer && a.tag == b.tag;
}

bool Matches(const MessageRecord& got, const MessageRecord& planned) {
  return SameMessage(got, planned) && got.shape == planned.shape && got.bytes == planned.bytes;
}

// What kind of mismatch message `index` is, looking at the messages around it.
std::string Kind(const std::vector<MessageRecord>& got, const std::vector<MessageRecord>& plan, size_t index) {
  if (index >= plan.size()) return "an extra message";
  if (index >= got.size()) return "a missing message";
  if (SameMessage(got[index], plan[index])) return "a mis-shaped message";
  if (index + 1 < got.size() && SameMessage(got[index + 1], plan[index])) return "an extra message";
  if (index + 1 < plan.size() && SameMessage(got[index], plan[index + 1])) return "a missing message";
  const bool planned_later = std::any_of(plan.begin() + static_cast<std::ptrdiff_t>(index), plan.end(),
                                         [&](const MessageRecord& p) { return SameMessage(p, got[index]); });
  return planned_later ? "a message out of order" : "a message the plan does not have";
}

std::string Mismatch(const std::vector<MessageRecord>& got, const std::vector<MessageRecord>& plan, size_t index,
                     int rank, int64_t step) {
  const std::string kind = Kind(got, plan, index);
  const std::string what = index < got.size() ? "posted " + pipeline::Describe(got[index]) : "posted nothing";
  const std::string planned = index < plan.size() ? "the plan has " + pipeline::Describe(plan[index])
                                                  : fmt::format("the plan has only {} messages", plan.size());
  return fmt::format("communication, step {}: rank {}'s message #{} is {}: it {}, where {} ({} messages posted, {} "
                     "planned)",
                     step, rank, index, kind, what, planned, got.size(), plan.size());
}

reports::CommRow Row(const std::string& scenario, int rank, int64_t step, size_t order, const MessageRecord* got,
                     const MessageRecord* planned, bool ok) {
  const auto shown = pipeline::DecodeTag(got ? got->tag : planned->tag);
  reports::CommRow row;
  row.scenario = scenario;
  row.rank = rank;
  row.step = step;
  row.order = static_cast<int64_t>(order);
  row.direction = pipeline::DirectionName(shown.direction);
  row.stage = shown.stage;
  row.microbatch = shown.microbatch;
  if (got) {
    row.op = got->send ? "send" : "recv";
    row.peer = got->peer;
    row.dtype = reference::DtypeName(got->shape.dtype);
    row.shape = fmt::format("({})", fmt::join(got->shape.sizes, ", "));
    row.bytes = got->bytes;
  }
  row.planned = planned ? pipeline::Describe(*planned) : "none";
  row.ok = ok;
  return row;
}

}  // namespace

CommVerdict CheckCommunication(const CommInput& input) {
  CommVerdict verdict;
  const int64_t steps = input.config.train.steps;
  verdict.first_problem.resize(static_cast<size_t>(steps));
  std::vector<size_t> first_index(static_cast<size_t>(steps), SIZE_MAX);
  for (int64_t step = input.config.first_step; step < steps; ++step) {  // a resumed run: its own steps
    const auto batch = reference::MakeBatch(input.config.train.data, input.config.train.seed, step);
    for (const auto& rank : input.ranks) {
      const auto plan = pipeline::PlannedMessages(input.config, input.schedule, rank.rank, step, batch);
      std::vector<MessageRecord> got;
      for (const auto& message : rank.messages) {
        if (message.step == step) got.push_back(message);
      }
      bool mismatched = false;
      for (size_t i = 0; i < std::max(got.size(), plan.size()); ++i) {
        const MessageRecord* posted = i < got.size() ? &got[i] : nullptr;
        const MessageRecord* planned = i < plan.size() ? &plan[i] : nullptr;
        const bool ok = posted && planned && Matches(*posted, *planned);
        verdict.rows.push_back(Row(input.scenario, rank.rank, step, i, posted, planned, ok));
        if (ok || mismatched) continue;
        mismatched = true;  // what follows a rank's first mismatch is its consequence
        auto& first = first_index[static_cast<size_t>(step)];
        if (i < first) {
          first = i;
          verdict.first_problem[static_cast<size_t>(step)] = Mismatch(got, plan, i, rank.rank, step);
        }
      }
    }
  }
  return verdict;
}

CommVerdict CheckCollectives(const CollectiveInput& input) {
  CommVerdict verdict;
  verdict.first_problem.resize(input.steps);
  const auto first = input.ranks.empty() ? size_t{0} : static_cast<size_t>(input.ranks.front().first_step);
  for (size_t step = first; step < input.steps; ++step) {
    for (const auto& rank : input.ranks) {
      int64_t elements = 0;
      for (const auto& item : rank.final_weights) elements += item.value().numel();
      double last_backward_end = 0.0;
      for (const auto& t : rank.timeline) {
        const bool backward = t.action.kind == pipeline::ActionKind::kBackward ||
                              t.action.kind == pipeline::ActionKind::kBackwardWeight;
        if (t.step == static_cast<int64_t>(step) && backward) last_backward_end = std::max(last_backward_end, t.end_us);
      }
      std::vector<const pipeline::CollectiveRecord*> done;
      for (const auto& c : rank.collectives) {
        if (c.step == static_cast<int64_t>(step)) done.push_back(&c);
      }
      const std::string planned = fmt::format("all-reduce of {} gradient elements over {} replicas after the last "
                                              "backward", elements, rank.replicas);
      const std::string stage = rank.stages.empty() ? "" : fmt::format(" (stage {})", fmt::join(rank.stages, ";"));
      std::string problem;
      if (done.empty()) {
        problem = fmt::format("data parallel, step {}: {}{} performed no all-reduce of its gradients; the plan has an {}",
                              step, rank.Who(), stage, planned);
      } else if (done.size() > 1) {
        problem = fmt::format("data parallel, step {}: {}{} performed {} all-reduces; the plan has one", step,
                              rank.Who(), stage, done.size());
      } else if (done.front()->elements != elements) {
        problem = fmt::format("data parallel, step {}: {}{} all-reduced {} gradient elements; the plan has {}", step,
                              rank.Who(), stage, done.front()->elements, elements);
      } else if (done.front()->start_us < last_backward_end) {
        problem = fmt::format("data parallel, step {}: {}{} issued its all-reduce at {:.0f} us, before its last "
                              "backward ended at {:.0f} us: gradients made after it are its replica's own",
                              step, rank.Who(), stage, done.front()->start_us, last_backward_end);
      }
      for (size_t i = 0; i < std::max<size_t>(done.size(), 1); ++i) {
        reports::CommRow row;
        row.scenario = input.scenario;
        row.rank = rank.rank;
        row.replica = rank.replica;
        row.step = static_cast<int64_t>(step);
        row.order = static_cast<int64_t>(i);
        row.direction = "gradients";
        row.stage = rank.stages.empty() ? 0 : rank.stages.front();
        row.microbatch = -1;
        if (i < done.size()) {
          row.op = "allreduce";
          row.shape = fmt::format("({})", done[i]->elements);
          row.bytes = done[i]->bytes;
        }
        row.planned = i == 0 ? planned : "none";
        row.ok = problem.empty();
        verdict.rows.push_back(row);
      }
      if (!problem.empty() && verdict.first_problem[step].empty()) verdict.first_problem[step] = problem;
    }
  }
  return verdict;
}

}  // namespace pipecheck::harness
