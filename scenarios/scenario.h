// Scenario suites: CSV files with one scenario per row (docs/scenarios.md), loaded with the fccp
// parser and validated completely before anything runs. Every error names file, line,
// column, the bad value and what is allowed.
// Not a model or trainer description: the harness maps a Scenario onto those.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pipecheck::scenarios {

// Bad scenario input. what() reads "FILE:LINE:COLUMN: column 'NAME': value 'V': problem".
class ScenarioError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Scenario {
  std::string name;
  std::string flavor = "llama";
  int64_t layers = 4;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // grouped-query attention's key/value heads; 0: heads (none grouped)
  int64_t ffn = 0;  // 0: the flavour's default, resolved by the harness
  // Mixture of experts (llama): experts 0 is the dense MLP (docs/design.md §2).
  int64_t experts = 0;
  int64_t top_k = 2;
  int64_t dense_layers = 0;
  int64_t shared_experts = 0;
  int64_t expert_ffn = 0;  // 0: ffn
  std::string router = "softmax";
  double aux_loss = 0.01;
  double expert_bias = 0.0;  // γ of the auxiliary-loss-free balancing; 0: off
  int64_t vocab = 256;
  bool tied = false;
  int64_t world_size = 2;
  std::string schedule = "1f1b";
  int64_t virtual_stages = 1;
  std::string transport = "auto";  // auto, gloo, nccl or staged (docs/design.md §4)
  std::string partition = "uniform";  // uniform, params, or explicit counts "2;0;3;1"
  int64_t batch = 8;
  int64_t microbatches = 4;
  int64_t seq_len = 32;
  int64_t seq_len_min = 0;  // resolved to seq_len when not given
  std::string dtype = "float64";
  int64_t steps = 2;
  // Steps timed for tokens/s (judged ones after the warm-up, then timing-only ones), when the run
  // is not told (`run --timed-steps`); -1: the run's default.
  int64_t timed_steps = -1;
  std::string optimizer = "adamw";
  double lr = 1e-3;
  double clip = 0.0;
  bool recompute = false;  // keep only each stage's input in the forward; recompute the rest in the backward
  // Replicas of the pipeline (PP x DP): world_size stays one pipeline's ranks, and a run starts
  // world_size x data_parallel processes.
  int64_t data_parallel = 1;
  // Gradient accumulation: rounds of the schedule (each over `microbatches`) per optimizer step.
  // The step's global batch splits into data_parallel x accumulation x microbatches microbatches;
  // the gradients of every round add up before the one tied sum, average, clip and update.
  int64_t accumulation = 1;
  // Loss normalisation: "tokens" (the step's summed token cross entropy over its labelled tokens)
  // or "microbatch_mean" (each microbatch's token mean, averaged over the step's microbatches of
  // every replica and round: DeepSpeed's and Megatron's default).
  std::string loss = "tokens";
  uint64_t seed = 1234;
  std::string device = "cpu";
  double tol = 0.0;  // resolved from dtype when not given
  std::string fault = "none";
  // "pass" or "fail", resolved for the PyTorch this build runs (see expect_written).
  std::string expect = "pass";
  // As the suite wrote it: "pass", "fail", or OUTCOME<MAJOR.MINOR ("fail<2.15": fail on a PyTorch
  // older than 2.15, pass from 2.15 on), for findings that hold on part of the supported range.
  std::string expect_written = "pass";
  // Who trains: "pipecheck" (this project's pipeline trainer), "torch" (PyTorch's
  // torch.distributed.pipelining, driven by trainers/torch_pipelining.py), "torchtitan" (TorchTitan's
  // own Trainer, driven by trainers/torchtitan_adapter.py) or "external:PATH" (any program speaking
  // the external-trainer protocol, docs/protocol.md; PATH relative to the suite).
  std::string trainer = "pipecheck";
  // Free text for people (the upstream issue an expect=fail row reproduces); changes nothing.
  std::string note;
  // Stop, reshard, resume: `resume` as written ("2:world_size=4|4:world_size=1"); each resume's
  // step and layout settings in order, and the scenario at the layout after each (every column
  // the row's but those; validated as a row is). Empty: the run never stops.
  struct Resume {
    int64_t step = 0;
    std::vector<std::pair<std::string, std::string>> settings;  // column, value
  };
  std::string resume;
  std::vector<Resume> resumes;
  std::vector<Scenario> layouts;

  // Where it came from, for messages: "core.csv:7", and where its file's columns sit (1-based).
  std::string source;
  std::map<std::string, size_t> column_positions;
  // The schedule as the suite wrote it: `csv:PATH` stays relative to the suite file in reports,
  // where `schedule` holds the path resolved for opening.
  std::string schedule_written;

  // An external:PATH trainer's program, resolved against the suite's folder ("" otherwise).
  std::string trainer_path;

  // Explicit partition counts, empty for uniform/params.
  std::vector<int64_t> PartitionCounts() const;
  // Whether another trainer than pipecheck's own is under test (torch or external:PATH).
  bool ExternalTrainer() const { return trainer != "pipecheck"; }
  // Every process of the run: world_size x data_parallel.
  int64_t Processes() const { return world_size * data_parallel; }
  // Microbatches of one optimizer step across every replica and round.
  int64_t StepMicrobatches() const { return data_parallel * accumulation * microbatches; }
};

// The columns, in docs/scenarios.md order.
const std::vector<std::string>& ColumnNames();

// Each column's value for this scenario, formatted as the CSV would hold it.
std::vector<std::pair<std::string, std::string>> ColumnValues(const Scenario& scenario);

// The columns summary.csv repeats from the scenario, by summary.csv's names, with this scenario's
// values as text (a csv:PATH schedule as the suite wrote it).
std::vector<std::pair<std::string, std::string>> SummaryValues(const Scenario& scenario);

// Where a message about one of the row's values points, as the loader's errors do:
// "core.csv:7:3: column 'seq_len', value '64'", or "core.csv:7: column 'seq_len' (not in file,
// default '32')" for a column the file leaves out.
std::string ValuePlace(const Scenario& scenario, const std::string& column);

// Every column that changes what a run computes or measures, as "column=value" pairs joined by
// spaces: all but name and expect. A csv: schedule is named as written, with its file's content
// hash (`csv:s.csv#1a2b...`), so an edited schedule file is a changed configuration too.
std::string Configuration(const Scenario& scenario);
// A short, stable digest of Configuration(): 16 hex digits (64-bit FNV-1a).
std::string Fingerprint(const std::string& configuration);

// A suite's text: the header and one row per scenario, every column at its value; it loads back
// as the same scenarios.
std::string ToCsv(const std::vector<Scenario>& scenarios);

// The largest learning rate a scenario may set.
constexpr double kMaxLearningRate = 10.0;

// The names the `schedule` and `fault` columns accept. They belong to the pipeline (its
// generators and its faults), which this loader may not include, so the caller passes them in
// (harness::PipelineVocabulary()) and each list is written once, where it is implemented.
struct Scenario;
// What the loader needs to know of a schedule to check a row's virtual_stages.
struct ScheduleRule {
  std::string name;
  bool several_stages_per_rank = false;  // takes virtual_stages > 1
  int64_t fixed_virtual_stages = 0;      // the one count it runs (a V: 2); 0 any
  int64_t default_virtual_stages = 1;    // what a row that leaves virtual_stages out gets
};
struct Vocabulary {
  std::vector<std::string> schedules;  // the `schedule` column also takes csv:PATH (relative to the suite file)
  std::vector<ScheduleRule> schedule_rules;
  std::vector<std::string> faults;
  // Why the scenario's schedule cannot run on its shape ("" when it can): generator constraints,
  // a CSV schedule's broken cells, a deadlock. Reported against the `schedule` column.
  std::function<std::string(const Scenario&)> schedule_problem;
  // The PyTorch this build links and its trainer=torch runs (major, minor): what an
  // `expect` of the form OUTCOME<MAJOR.MINOR is resolved against.
  std::pair<int, int> torch_version{0, 0};
  // Set (`--device`): every row runs on this device and is checked as if it said so, so a cuda
  // row with transport gloo is refused; on cpu every transport is Gloo, so a row's CUDA transport
  // (nccl, staged) is moot there rather than wrong.
  std::string device;
};

// docs/scenarios.md's table of columns: name, default, values and meaning, one row a column, from
// the table the loader reads with (a test keeps the document equal to it).
std::string ColumnsMarkdown(const Vocabulary& vocabulary);

// A suite file's text, at most 16 MiB of it; throws ScenarioError (a directory, unreadable, larger).
std::string ReadSuiteText(const std::string& path);

// A suite's text as the loader reads it: without a byte-order mark, CR-only line ends made LF,
// indented comments blanked (a comment starting its line stays); line numbers stay the file's.
std::string SuiteTextAsRead(const std::string& raw_text);

// Loads and validates a suite; throws ScenarioError.
std::vector<Scenario> LoadScenarios(const std::string& path, const Vocabulary& vocabulary);

// How many suites this process has loaded from files (LoadScenarios): a worker handed a plan loads none.
int64_t SuitesLoaded();

// The same from text in memory; `display_name` stands for the file in messages.
std::vector<Scenario> ParseScenarios(const std::string& text, const std::string& display_name,
                                     const Vocabulary& vocabulary);

// Scenarios whose name matches a shell glob (`*`, `?`, `[...]`); an empty glob matches all.
// `globs`: comma-separated shell globs on names; a scenario matching any is kept, in suite
// order. Empty keeps every scenario. A glob that matches no scenario is a ScenarioError naming it
// (a typo must not quietly shrink the run), as is a selection that keeps nothing.
std::vector<Scenario> SelectScenarios(const std::vector<Scenario>& scenarios, const std::string& globs,
                                      const std::string& path = "the suite");

// The scenario called `name`; throws ScenarioError naming the file when there is none.
const Scenario& FindScenario(const std::vector<Scenario>& scenarios, const std::string& name,
                             const std::string& path);

}  // namespace pipecheck::scenarios
