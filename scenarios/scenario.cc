// Scenario CSV loading and validation (see scenario.h). Parsing is fccp's; this file adds the
// column table, strict value parsing and the cross-column rules, each error carrying its
// location.
#include "scenarios/scenario.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>
#include <libfccp/csv.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "pipeline/schedule_name.h"
#include "scenarios/dtypes.h"

namespace pipecheck::scenarios {
namespace {

// The columns of a suite, in docs/scenarios.md order (Columns() lists them).
constexpr size_t kColumnCount = 44;

const std::vector<std::string> kFlavors = {"llama", "gpt2"};
const std::vector<std::string> kRouters = {"softmax", "sigmoid"};
const std::vector<std::string> kDtypes = DtypeNames();
const std::vector<std::string> kOptimizers = {"sgd", "adamw"};
const std::vector<std::string> kDevices = {"cpu", "cuda"};
const std::vector<std::string> kLossModes = {"tokens", "microbatch_mean"};
const std::vector<std::string> kTransports = {"auto", "gloo", "nccl", "staged"};
// The schedule and fault names the caller said exist (the lists live where they are
// implemented, in pipeline/, which this loader may not include), for the parse under way.
const Vocabulary*& CurrentVocabulary() {
  static thread_local const Vocabulary* vocabulary = nullptr;
  return vocabulary;
}

const std::vector<std::string> kExpectations = {"pass", "fail"};

// Upper bounds on sizes: generous for any model a CI runner can hold, tight enough to catch
// typos (an extra zero) before a run spends minutes or all memory on them. docs/scenarios.md lists them.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxWidth = 65536;
constexpr int64_t kMaxExperts = 1024;  // hidden; ffn up to 8x this
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxVocab = 1 << 20;
constexpr int64_t kMaxWorldSize = 256;
constexpr int64_t kMaxVirtualStages = 16;
constexpr int64_t kMaxBatch = 65536;  // also microbatches
constexpr int64_t kMaxSeqLen = 65536;
constexpr int64_t kMaxSteps = 100000;
constexpr int64_t kMaxTimedSteps = 1000;  // as `run --timed-steps`
constexpr int64_t kMaxAccumulation = 1024;
constexpr size_t kMaxSuiteBytes = 16 << 20;  // a suite file

// A bad value; the loader adds file, line and column.
struct ValueProblem {
  std::string what;
};

int64_t ParseInteger(const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < min || value > max) {
    throw ValueProblem{fmt::format("expected an integer in [{}, {}]", min, max)};
  }
  return value;
}

uint64_t ParseSeed(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) throw ValueProblem{"expected an integer in [0, 2^64 - 1]"};
  return value;
}

// A finite real number above `min` (or at least `min` when `min_allowed`).
double ParseReal(const std::string& text, double min, bool min_allowed) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  const bool in_range = min_allowed ? value >= min : value > min;
  if (ec != std::errc() || ptr != end || !std::isfinite(value) || !in_range) {
    throw ValueProblem{fmt::format("expected a finite number {} {}", min_allowed ? ">=" : ">", min)};
  }
  return value;
}

std::string ParseChoice(const std::string& text, const std::vector<std::string>& choices) {
  for (const auto& choice : choices) {
    if (text == choice) return text;
  }
  throw ValueProblem{fmt::format("expected one of: {}", fmt::join(choices, ", "))};
}

bool ParseFlag(const std::string& text) {
  if (text == "0") return false;
  if (text == "1") return true;
  throw ValueProblem{"expected 0 or 1"};
}

// Names become file and folder names (rank logs, reports): short, and never '.' or '..'.
constexpr size_t kMaxNameLength = 100;

std::string ParseName(const std::string& text) {
  const bool valid = !text.empty() && text.size() <= kMaxNameLength && text != "." && text != ".." &&
                     text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") ==
                         std::string::npos;
  if (!valid) {
    throw ValueProblem{fmt::format("expected a name of 1 to {} letters, digits, '_', '.' and '-', other than '.' and "
                                   "'..'", kMaxNameLength)};
  }
  return text;
}

// A fault's name: which names exist depends on the trainer (CheckCombinations).
std::string ParseFaultName(const std::string& text) {
  if (text.empty() || text.size() > 64 || text.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    throw ValueProblem{"expected a fault's name: lower-case letters, digits and '_'"};
  }
  return text;
}

const std::vector<std::string> kTrainers = {"pipecheck", "torch", "torchtitan", "deepspeed", "megatron", "external:PATH"};

// `expect`: pass, fail, or OUTCOME<MAJOR.MINOR, resolved against the build's PyTorch `torch`:
// OUTCOME below that version, the other outcome from it on.
std::string ParseExpectation(const std::string& value, std::pair<int, int> torch) {
  if (std::find(kExpectations.begin(), kExpectations.end(), value) != kExpectations.end()) return value;
  const std::string usage = "expected pass, fail, or OUTCOME<MAJOR.MINOR (fail<2.15: fail on PyTorch older than 2.15, "
                            "pass from 2.15 on)";
  const auto bound = value.find('<');
  if (bound == std::string::npos) throw ValueProblem{usage};
  const std::string outcome = value.substr(0, bound);
  const std::string version = value.substr(bound + 1);
  const auto dot = version.find('.');
  if (std::find(kExpectations.begin(), kExpectations.end(), outcome) == kExpectations.end() ||
      version.size() > 9 || dot == std::string::npos || dot == 0 || dot + 1 == version.size() ||
      version.find_first_not_of("0123456789.") != std::string::npos || version.find('.', dot + 1) != std::string::npos) {
    throw ValueProblem{usage};
  }
  const std::pair<int, int> since{std::stoi(version.substr(0, dot)), std::stoi(version.substr(dot + 1))};
  if (torch < since) return outcome;
  return outcome == "pass" ? "fail" : "pass";
}

std::string ParseTrainer(const std::string& text) {
  const std::string prefix = "external:";
  if (text.rfind(prefix, 0) == 0) {
    if (text.size() == prefix.size()) throw ValueProblem{"external: needs the trainer program's path, as external:PATH"};
    return text;  // resolved against the suite's folder once the row is read
  }
  if (std::find(kTrainers.begin(), kTrainers.end() - 1, text) != kTrainers.end() - 1) return text;
  throw ValueProblem{fmt::format("expected one of: {}", fmt::join(kTrainers, ", "))};
}

std::string ParsePartition(const std::string& text) {
  if (text == "uniform" || text == "params") return text;
  std::stringstream stream(text);
  std::string count;
  size_t entries = 0;
  while (std::getline(stream, count, ';')) {
    try {
      ParseInteger(count, 0, kMaxLayers);
    } catch (const ValueProblem&) {
      throw ValueProblem{"expected uniform, params, or layer counts per stage such as 2;0;3;1"};
    }
    ++entries;
  }
  if (entries == 0 || text.back() == ';') {
    throw ValueProblem{"expected uniform, params, or layer counts per stage such as 2;0;3;1"};
  }
  return text;
}

std::string FormatReal(double value) { return fmt::format("{}", value); }

// A number as docs write it: 1e-9 and 5e-2 below 0.1 (not 1e-09 or 0.05), else as {:g} has it.
std::string Short(double value) {
  if (value <= 0.0 || value >= 0.1) return fmt::format("{:g}", value);
  const auto exponent = static_cast<int>(std::floor(std::log10(value)));
  return fmt::format("{:g}e{}", value / std::pow(10.0, exponent), exponent);
}

// `text` safe to print on a terminal: bytes outside printable ASCII as \xNN, cut at 80.
std::string Printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return text.size() > 80 ? out + "..." : out;
}

// RFC 4180 allows a line break inside a quoted field; no scenario value can hold one, and fccp
// reads line by line, so say so at the field's start instead of a confusing later error.
void RejectQuotedLineBreaks(const std::string& text, const std::string& file) {
  bool quoted = false;
  unsigned line = 1, column = 1, quote_line = 0, quote_column = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      quoted = !quoted;
      if (quoted) quote_line = line, quote_column = column;
    } else if (c == '\n') {
      if (quoted && text.find('"', i) == std::string::npos) {
        throw ScenarioError(fmt::format("{}:{}:{}: a quoted field is not closed", file, quote_line, quote_column));
      }
      if (quoted) {
        throw ScenarioError(fmt::format("{}:{}:{}: a quoted field spans lines; scenario values cannot contain "
                                        "line breaks (close the quote on the same line)", file, quote_line,
                                        quote_column));
      }
      ++line, column = 0;
    }
    ++column;
  }
}

// What fccp reads: CR-only line ends become LF, and a line whose first non-blank character is
// '#' becomes empty (a comment, like an unindented one), so line numbers stay the file's.
std::string NormaliseLines(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && (i + 1 == text.size() || text[i + 1] != '\n')) {
      out += '\n';
    } else {
      out += text[i];
    }
  }
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const size_t first = out.find_first_not_of(" \t", start);
    if (first < end && out[first] == '#' && first > start) {
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(start), out.begin() + static_cast<std::ptrdiff_t>(end), ' ');
    }
    start = end + 1;
  }
  return out;
}

// Whether a column joins a scenario's configuration (summary.csv's `config` and `fingerprint`).
enum class InConfiguration {
  kAlways,
  kNever,         // names and notes: they change nothing computed
  kUnlessDefault  // added after fingerprints were recorded: a row at the default keeps its old one
};

// One column: its name, how a cell is read into a Scenario and written back out, and what
// docs/scenarios.md says of it (its table is ColumnsMarkdown()'s, checked by a test).
struct Column {
  std::string name;
  std::function<void(Scenario&, const std::string&)> parse;
  std::function<std::string(const Scenario&)> format;
  std::function<std::string(const Vocabulary&)> values;  // what a cell may hold
  std::string meaning;
  std::string default_shown;  // the default as documented; empty: format() of a default Scenario
  InConfiguration configuration = InConfiguration::kAlways;
  bool summary = false;  // summary.csv carries it, under the same name ("scenario" for name)

  Column& Means(std::string text) { return meaning = std::move(text), *this; }
  Column& Default(std::string text) { return default_shown = std::move(text), *this; }
  Column& Config(InConfiguration in) { return configuration = in, *this; }
  Column& InSummary() { return summary = true, *this; }
  Column& Values(std::function<std::string(const Vocabulary&)> text) { return values = std::move(text), *this; }
};

Column TextColumn(std::string name, std::function<void(Scenario&, const std::string&)> parse,
                  std::function<std::string(const Scenario&)> format, std::string values) {
  Column column;
  column.name = std::move(name);
  column.parse = std::move(parse);
  column.format = std::move(format);
  column.values = [values = std::move(values)](const Vocabulary&) { return values; };
  return column;
}

Column IntegerColumn(std::string name, int64_t Scenario::*field, int64_t min, int64_t max) {
  return TextColumn(std::move(name), [=](Scenario& s, const std::string& v) { s.*field = ParseInteger(v, min, max); },
                    [=](const Scenario& s) { return std::to_string(s.*field); }, fmt::format("{} to {}", min, max));
}

Column ChoiceColumn(std::string name, std::string Scenario::*field, const std::vector<std::string>& choices) {
  Column column = TextColumn(std::move(name), [field, &choices](Scenario& s, const std::string& v) { s.*field = ParseChoice(v, choices); },
                             [=](const Scenario& s) { return s.*field; }, "");
  column.values = [&choices](const Vocabulary&) { return fmt::format("{}", fmt::join(choices, ", ")); };
  return column;
}

Column FlagColumn(std::string name, bool Scenario::*field) {
  return TextColumn(std::move(name), [=](Scenario& s, const std::string& v) { s.*field = ParseFlag(v); },
                    [=](const Scenario& s) { return std::string(s.*field ? "1" : "0"); }, "0, 1");
}

Column RealColumn(std::string name, double Scenario::*field, double min, bool min_allowed, std::string values) {
  return TextColumn(std::move(name), [=](Scenario& s, const std::string& v) { s.*field = ParseReal(v, min, min_allowed); },
                    [=](const Scenario& s) { return FormatReal(s.*field); }, std::move(values));
}

// The columns of the model.
std::vector<Column> ModelColumns() {
  using In = InConfiguration;
  return {
      TextColumn("name", [](Scenario& s, const std::string& v) { s.name = ParseName(v); },
                 [](const Scenario& s) { return s.name; }, "1 to 100 of `A-Z a-z 0-9 _ . -`, not `.` or `..`, unique")
          .Means("the scenario's name in every report (required)").Default("(required)")
          .Config(In::kNever).InSummary(),
      ChoiceColumn("flavor", &Scenario::flavor, kFlavors).Means("the model: llama (RMSNorm, SwiGLU, RoPE) or gpt2"),
      IntegerColumn("layers", &Scenario::layers, 1, kMaxLayers).Means("transformer blocks"),
      IntegerColumn("hidden", &Scenario::hidden, 1, kMaxWidth).Means("model width"),
      IntegerColumn("heads", &Scenario::heads, 1, kMaxHeads).Means("attention heads (dividing hidden)"),
      TextColumn("kv_heads", [](Scenario& s, const std::string& v) { s.kv_heads = ParseInteger(v, 1, kMaxHeads); },
                 [](const Scenario& s) { return s.kv_heads == 0 ? std::string() : std::to_string(s.kv_heads); },
                 fmt::format("1 to {}, dividing heads", kMaxHeads))
          .Means("key/value heads of grouped-query attention (llama): query head h attends with key/value head "
                 "h ÷ (heads ÷ kv_heads)")
          .Default("heads (no grouping)").Config(InConfiguration::kUnlessDefault),
      TextColumn("ffn", [](Scenario& s, const std::string& v) { s.ffn = ParseInteger(v, 1, kMaxWidth * 8); },
                 [](const Scenario& s) { return s.ffn == 0 ? std::string() : std::to_string(s.ffn); },
                 fmt::format("1 to {}", kMaxWidth * 8))
          .Means("feed-forward width").Default("gpt2 4×hidden; llama ⌈8×hidden/3⌉ rounded up to a multiple of 4"),
      IntegerColumn("experts", &Scenario::experts, 0, kMaxExperts)
          .Means("mixture of experts (llama): routed experts of each MoE layer's feed-forward; 0 is the dense MLP, "
                 "else at least 2")
          .Config(In::kUnlessDefault),
      IntegerColumn("top_k", &Scenario::top_k, 1, kMaxExperts)
          .Means("experts each token takes (at most experts)").Config(In::kUnlessDefault),
      IntegerColumn("dense_layers", &Scenario::dense_layers, 0, kMaxLayers)
          .Means("the first layers keep the dense MLP (DeepSeek's first dense layers)").Config(In::kUnlessDefault),
      IntegerColumn("shared_experts", &Scenario::shared_experts, 0, 1)
          .Means("an expert every token passes through, added to the routed output").Config(In::kUnlessDefault),
      TextColumn("expert_ffn", [](Scenario& s, const std::string& v) { s.expert_ffn = ParseInteger(v, 1, kMaxWidth * 8); },
                 [](const Scenario& s) { return s.expert_ffn == 0 ? std::string() : std::to_string(s.expert_ffn); },
                 fmt::format("1 to {}", kMaxWidth * 8))
          .Means("each expert's feed-forward width").Default("ffn").Config(In::kUnlessDefault),
      ChoiceColumn("router", &Scenario::router, kRouters)
          .Means("scores from the router's logits: a softmax over the experts, or each logit's sigmoid (DeepSeek-V3)")
          .Config(In::kUnlessDefault),
      RealColumn("aux_loss", &Scenario::aux_loss, 0.0, /*min_allowed=*/true, "≥ 0, at most 1")
          .Means("α of the sequence-wise balance loss added to the objective; 0 is none").Config(In::kUnlessDefault),
      RealColumn("expert_bias", &Scenario::expert_bias, 0.0, /*min_allowed=*/true, "≥ 0, at most 1")
          .Means("γ of the auxiliary-loss-free balancing: each expert's bias for the choice moves by γ after each step, "
                 "toward balanced counts; 0 is off")
          .Config(In::kUnlessDefault),
      IntegerColumn("vocab", &Scenario::vocab, 2, kMaxVocab).Means("vocabulary size"),
      FlagColumn("tied", &Scenario::tied).Means("the output head shares the embedding's weight"),
  };
}

// The columns of the pipeline's layout.
std::vector<Column> LayoutColumns() {
  return {
      IntegerColumn("world_size", &Scenario::world_size, 1, kMaxWorldSize).Means("ranks of one pipeline").InSummary(),
      TextColumn("schedule",
                 [](Scenario& s, const std::string& v) {
                   if (const auto path = pipeline::ScheduleCsvPath(v)) {
                     if (path->empty()) throw ValueProblem{"csv: needs the schedule file's path, as csv:PATH"};
                     s.schedule = v;  // resolved against the suite's folder once the row is read
                   } else {
                     s.schedule = ParseChoice(v, CurrentVocabulary()->schedules);
                   }
                 },
                 [](const Scenario& s) { return s.schedule; }, "")
          .Values([](const Vocabulary& v) { return fmt::format("{}, csv:PATH", fmt::join(v.schedules, ", ")); })
          .Means("the pipeline schedule (below)").InSummary(),
      IntegerColumn("virtual_stages", &Scenario::virtual_stages, 1, kMaxVirtualStages)
          .Means("stages per rank").Default("the schedule's own: 2 for interleaved, zbv, dualpipev and loopedbfs, else 1")
          .InSummary(),
      ChoiceColumn("transport", &Scenario::transport, kTransports).Means("how ranks exchange tensors (below)"),
      TextColumn("partition", [](Scenario& s, const std::string& v) { s.partition = ParsePartition(v); },
                 [](const Scenario& s) { return s.partition; }, "uniform, params, or layers per stage such as `2;0;3;1`")
          .Means("how layers split into stages"),
  };
}

// The columns of the data and the step.
std::vector<Column> DataColumns() {
  using In = InConfiguration;
  return {
      IntegerColumn("batch", &Scenario::batch, 1, kMaxBatch).Means("sequences per optimizer step"),
      IntegerColumn("microbatches", &Scenario::microbatches, 1, kMaxBatch).Means("microbatches per round of the schedule").InSummary(),
      IntegerColumn("seq_len", &Scenario::seq_len, 2, kMaxSeqLen).Means("tokens per sequence (the longest)"),
      IntegerColumn("seq_len_min", &Scenario::seq_len_min, 2, kMaxSeqLen)
          .Means("the shortest sequence: lengths vary between the two").Default("seq_len"),
      ChoiceColumn("dtype", &Scenario::dtype, kDtypes).Means("parameters' and activations' dtype").InSummary(),
      IntegerColumn("steps", &Scenario::steps, 1, kMaxSteps).Means("judged optimizer steps").InSummary(),
      TextColumn("timed_steps", [](Scenario& s, const std::string& v) { s.timed_steps = ParseInteger(v, 0, kMaxTimedSteps); },
                 [](const Scenario& s) { return s.timed_steps < 0 ? std::string() : std::to_string(s.timed_steps); },
                 fmt::format("0 to {}", kMaxTimedSteps))
          .Means("steps timed for tokens/s and its spread, when `run --timed-steps` is not given (below)")
          .Default("the run's: 20").Config(InConfiguration::kNever),
      ChoiceColumn("optimizer", &Scenario::optimizer, kOptimizers).Means("AdamW or plain SGD"),
      RealColumn("lr", &Scenario::lr, 0.0, /*min_allowed=*/false, "> 0, at most " + Short(kMaxLearningRate))
          .Means("learning rate"),
      RealColumn("clip", &Scenario::clip, 0.0, /*min_allowed=*/true, "≥ 0").Means("global gradient-norm clip; 0 is off"),
      FlagColumn("recompute", &Scenario::recompute).Means("each stage recomputes its forward in the backward (below)").InSummary(),
      IntegerColumn("data_parallel", &Scenario::data_parallel, 1, kMaxWorldSize)
          .Means("replicas of the pipeline (below)").Config(In::kUnlessDefault).InSummary(),
      IntegerColumn("accumulation", &Scenario::accumulation, 1, kMaxAccumulation)
          .Means("rounds of the schedule per optimizer step (below)").Config(In::kUnlessDefault).InSummary(),
      ChoiceColumn("loss", &Scenario::loss, kLossModes)
          .Means("how the step's loss is normalised (below)").Config(In::kUnlessDefault),
      TextColumn("resume", [](Scenario& s, const std::string& v) { s.resume = v; },
                 [](const Scenario& s) { return s.resume; },
                 "`STEP` or `STEP:COLUMN=VALUE;…`, several joined by `|`")
          .Means("stop after STEP, checkpoint, resume at the layout the columns give (below)")
          .Config(In::kUnlessDefault),
  };
}

// The columns of the run and its judging.
std::vector<Column> RunColumns() {
  using In = InConfiguration;
  return {
      TextColumn("seed", [](Scenario& s, const std::string& v) { s.seed = ParseSeed(v); },
                 [](const Scenario& s) { return std::to_string(s.seed); }, "0 to 2^64 - 1")
          .Means("weights and data"),
      ChoiceColumn("device", &Scenario::device, kDevices).Means("where every rank and the reference run").InSummary(),
      RealColumn("tol", &Scenario::tol, 0.0, /*min_allowed=*/false, [] {
        std::vector<std::string> most;
        for (const auto& dtype : Dtypes()) most.push_back(dtype.name + " " + Short(dtype.max_tol));
        return fmt::format("> 0, at most {}", fmt::join(most, ", "));
      }())
          .Means("relative tolerance on loss, gradients and weights")
          .Default([] {
            std::vector<std::string> defaults;
            for (const auto& dtype : Dtypes()) defaults.push_back(dtype.name + " " + Short(dtype.default_tol));
            return fmt::format("{}", fmt::join(defaults, ", "));
          }()),
      // Checked against the trainer's faults with the other columns (CheckCombinations).
      TextColumn("fault", [](Scenario& s, const std::string& v) { s.fault = ParseFaultName(v); },
                 [](const Scenario& s) { return s.fault; }, "none, or a fault of docs/faults.md (another trainer: its own names)")
          .Means("a bug injected into pipecheck's trainer, or handed to another"),
      TextColumn("expect",
                 [](Scenario& s, const std::string& v) {
                   s.expect_written = v;
                   s.expect = ParseExpectation(v, CurrentVocabulary()->torch_version);
                 },
                 [](const Scenario& s) { return s.expect; }, "pass, fail, or OUTCOME<MAJOR.MINOR such as `fail<2.15`")
          .Means("the outcome the row must have (below)").Config(In::kNever).InSummary(),
      TextColumn("trainer", [](Scenario& s, const std::string& v) { s.trainer = ParseTrainer(v); },
                 [](const Scenario& s) { return s.trainer; },
                 "pipecheck, torch, torchtitan, deepspeed, megatron, external:PATH")
          .Means("who trains (below)").Config(In::kUnlessDefault).InSummary(),
      TextColumn("note", [](Scenario& s, const std::string& v) { s.note = v; }, [](const Scenario& s) { return s.note; },
                 "free text")
          .Means("for people, e.g. the upstream issue an `expect=fail` row reproduces; changes nothing")
          .Config(In::kNever),
  };
}

// Every column, in docs/scenarios.md order.
std::vector<Column> MakeColumns() {
  std::vector<Column> columns;
  for (auto part : {ModelColumns(), LayoutColumns(), DataColumns(), RunColumns()}) {
    columns.insert(columns.end(), part.begin(), part.end());
  }
  return columns;
}

const std::vector<Column>& Columns() {
  static const std::vector<Column> columns = [] {
    auto made = MakeColumns();
    if (made.size() != kColumnCount) throw std::logic_error("the scenario column table holds the wrong count");
    std::set<std::string> names;
    for (const auto& column : made) {
      if (column.name.empty() || !names.insert(column.name).second) {
        throw std::logic_error("scenario column '" + column.name + "' is unnamed or listed twice");
      }
    }
    return made;
  }();
  return columns;
}

// Where the columns of this file sit, for messages: column name -> 1-based position.
struct Header {
  unsigned line = 0;
  std::map<std::string, size_t> positions;
};

// Formats the standard message for a problem at (line, column) of `file`.
class Locator {
 public:
  Locator(std::string file, const Header& header) : file_(std::move(file)), header_(header) {}

  ScenarioError At(unsigned line, const std::string& column, const std::string& raw_value,
                   const std::string& problem) const {
    const std::string value = Printable(raw_value);
    auto found = header_.positions.find(column);
    if (found == header_.positions.end()) {  // a default value that breaks a rule
      return ScenarioError(fmt::format("{}:{}: column '{}' (not in file, default '{}'): {}", file_, line,
                                       column, value, problem));
    }
    return ScenarioError(fmt::format("{}:{}:{}: column '{}', value '{}': {}", file_, line, found->second,
                                     column, value, problem));
  }

  ScenarioError AtLine(unsigned line, const std::string& problem) const {
    return ScenarioError(fmt::format("{}:{}: {}", file_, line, problem));
  }

 private:
  std::string file_;
  const Header& header_;
};

std::string Trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

// Reads the header with fccp's line reader and checks it: every column known, none twice,
// `name` present. fccp would reject the same headers, but cannot say at which column.
Header ReadHeader(const std::string& file, const std::string& text) {
  io::LineReader lines(file, text.data(), text.data() + text.size());
  Header header;
  const char* line = nullptr;
  while ((line = lines.next_line()) != nullptr) {
    if (!io::single_and_empty_line_comment<'#'>::is_comment(line)) break;
  }
  if (line == nullptr) {
    throw ScenarioError(fmt::format("{}: empty file: expected a header row naming the columns (at least 'name')", file));
  }
  header.line = lines.get_file_line();
  std::stringstream stream(line);
  std::string cell;
  size_t position = 0;
  while (std::getline(stream, cell, ',')) {
    ++position;
    cell = Trim(cell);
    if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = cell.substr(1, cell.size() - 2);
    if (cell.empty()) {
      throw ScenarioError(fmt::format("{}:{}:{}: empty column name in the header (a trailing or doubled comma?); "
                                      "allowed columns: {}", file, header.line, position, fmt::join(ColumnNames(), ", ")));
    }
    const bool known = std::find(ColumnNames().begin(), ColumnNames().end(), cell) != ColumnNames().end();
    if (!known) {
      throw ScenarioError(fmt::format("{}:{}:{}: unknown column '{}'; allowed columns: {}", file, header.line,
                                      position, Printable(cell), fmt::join(ColumnNames(), ", ")));
    }
    if (!header.positions.emplace(cell, position).second) {
      throw ScenarioError(fmt::format("{}:{}:{}: column '{}' appears twice (first at column {})", file,
                                      header.line, position, cell, header.positions[cell]));
    }
  }
  const std::string trimmed = Trim(std::string(line));
  if (!trimmed.empty() && trimmed.back() == ',') {
    throw ScenarioError(fmt::format("{}:{}:{}: empty column name in the header (a trailing or doubled comma?); "
                                    "allowed columns: {}", file, header.line, position + 1, fmt::join(ColumnNames(), ", ")));
  }
  if (!header.positions.count("name")) {
    throw ScenarioError(fmt::format("{}:{}: the header has no 'name' column (it is required)", file, header.line));
  }
  return header;
}

// The trainer against the columns that depend on it: a fault of pipecheck's trainer must be one it
// injects; another trainer gets the fault's name handed over (docs/protocol.md) and says itself
// whether it knows it.
void CheckTrainer(Scenario& s, unsigned line, const Locator& at) {
  if (!s.ExternalTrainer()) {
    const auto& faults = CurrentVocabulary()->faults;
    if (std::find(faults.begin(), faults.end(), s.fault) == faults.end()) {
      throw at.At(line, "fault", s.fault, fmt::format("expected one of: {}", fmt::join(faults, ", ")));
    }
  }
}

// What TorchTitan's configuration can express, refused before anything runs: its llama3 is a
// llama; it trains in float32 or bfloat16 (training.dtype has no float64); its optimizers are Adam,
// AdamW and Muon (no SGD); it splits a replica's batch into microbatches of one size
// (pipeline_parallel_microbatch_size).
void CheckTorchTitan(const Scenario& s, unsigned line, const Locator& at) {
  if (s.optimizer != "adamw") {
    throw at.At(line, "optimizer", s.optimizer,
                "trainer torchtitan steps TorchTitan's own optimizers (Adam, AdamW, DistMuon): optimizer must be adamw");
  }
  if (s.flavor != "llama") {
    throw at.At(line, "flavor", s.flavor, "trainer torchtitan trains TorchTitan's llama3: flavor must be llama");
  }
  if (s.dtype == "float64") {
    throw at.At(line, "dtype", s.dtype,
                "trainer torchtitan trains in float32 or bfloat16 (TorchTitan's training.dtype has no float64)");
  }
  const int64_t pieces = s.StepMicrobatches();
  if (pieces > 0 && s.batch % pieces != 0) {
    throw at.At(line, "batch", std::to_string(s.batch),
                fmt::format("trainer torchtitan splits the batch into microbatches of one size: batch {} must be a "
                            "multiple of {} (data_parallel x accumulation x microbatches)", s.batch, pieces));
  }
}

// The frameworks judged as whole trainers (their engines, their schedules, their data parallelism).
bool FrameworkTrainer(const Scenario& s) {
  return s.trainer == "torchtitan" || s.trainer == "deepspeed" || s.trainer == "megatron";
}

// What DeepSpeed's pipeline engine and Megatron-Core's schedules can be given, refused before
// anything runs: both train the llama of their adapters (trainers/deepspeed_adapter.py,
// megatron_adapter.py); neither has a float64 path; DeepSpeed's engine runs
// 1F1B only (its TrainSchedule), Megatron-Core's its 1F1B, interleaved for several stages a rank.
void CheckFramework(const Scenario& s, unsigned line, const Locator& at) {
  if (s.flavor != "llama") {
    throw at.At(line, "flavor", s.flavor, fmt::format("trainer {}'s adapter builds the llama flavour: flavor must be llama", s.trainer));
  }
  if (s.trainer == "deepspeed" && s.schedule != "1f1b") {
    throw at.At(line, "schedule", s.schedule,
                "trainer deepspeed runs its pipeline engine's one schedule (TrainSchedule, 1F1B): schedule must be 1f1b");
  }
  if (s.accumulation > 1) {
    throw at.At(line, "accumulation", std::to_string(s.accumulation),
                fmt::format("trainer {} accumulates over the microbatches of its one schedule run per step (its "
                            "gradient accumulation steps): set microbatches instead", s.trainer));
  }
  if (s.trainer == "deepspeed" && s.dtype == "float64") {
    throw at.At(line, "dtype", s.dtype,
                "trainer deepspeed trains in float32 or bfloat16 (its engine's gradient all-reduce refuses float64: "
                "split_half_float_double_sparse)");
  }
  if (s.trainer == "deepspeed" && s.recompute) {
    throw at.At(line, "recompute", "1", "trainer deepspeed's adapter does not configure activation checkpointing");
  }
  if (s.trainer == "megatron") {
    if (s.dtype == "float64") {
      throw at.At(line, "dtype", s.dtype, "trainer megatron trains in float32 or bfloat16 (Megatron-Core has no float64 path)");
    }
    const bool interleaved = s.schedule == "interleaved" && s.virtual_stages > 1;
    if (s.schedule != "1f1b" && !interleaved) {
      throw at.At(line, "schedule", s.schedule,
                  "trainer megatron runs Megatron-Core's schedules: 1f1b, or interleaved with virtual_stages > 1");
    }
    if (s.recompute) throw at.At(line, "recompute", "1", "trainer megatron's adapter does not configure recomputation");
  }
  const int64_t pieces = s.StepMicrobatches();
  if (pieces > 0 && s.batch % pieces != 0) {
    throw at.At(line, "batch", std::to_string(s.batch),
                fmt::format("trainer {} splits the batch into microbatches of one size: batch {} must be a "
                            "multiple of {} (data_parallel x accumulation x microbatches)", s.trainer, s.batch, pieces));
  }
}

// Data parallelism, recomputation and accumulation: pipecheck's own trainer runs all three, and
// the frameworks (TorchTitan, DeepSpeed, Megatron-Core: their data-parallel replicas, their
// recomputation, their gradient accumulation); PyTorch's pipelining recomputes (activation
// checkpointing of each block, as a pipelining user wraps them); another trainer is handed none of
// them, so a row asking for them there is refused, not ignored.
void CheckLayout(const Scenario& s, unsigned line, const Locator& at) {
  const bool layouts = !s.ExternalTrainer() || FrameworkTrainer(s);
  if (!layouts && s.data_parallel > 1) {
    throw at.At(line, "data_parallel", std::to_string(s.data_parallel),
                fmt::format("trainer {} is judged one pipeline at a time: data_parallel needs trainer=pipecheck or "
                            "a framework (torchtitan, deepspeed, megatron)", s.trainer));
  }
  if (!layouts && s.recompute && s.trainer != "torch") {
    throw at.At(line, "recompute", "1",
                fmt::format("trainer {} recomputes as it was written to: recompute needs trainer=pipecheck, torch "
                            "(activation checkpointing of each block) or a framework (torchtitan, deepspeed, megatron)",
                            s.trainer));
  }
  if (!layouts && s.accumulation > 1) {
    throw at.At(line, "accumulation", std::to_string(s.accumulation),
                fmt::format("trainer {} runs one round of its schedule per step: accumulation needs trainer=pipecheck "
                            "or a framework (torchtitan, deepspeed, megatron)", s.trainer));
  }
  if (s.ExternalTrainer() && s.timed_steps >= 0) {
    throw at.At(line, "timed_steps", std::to_string(s.timed_steps),
                fmt::format("trainer {} is timed over its judged steps: timed_steps needs trainer=pipecheck", s.trainer));
  }
  if (s.world_size * s.data_parallel > kMaxWorldSize) {
    throw at.At(line, "data_parallel", std::to_string(s.data_parallel),
                fmt::format("world_size {} x data_parallel {} = {} processes, more than {}", s.world_size,
                            s.data_parallel, s.world_size * s.data_parallel, kMaxWorldSize));
  }
  // The global batch splits into data_parallel x accumulation x microbatches microbatches, each
  // replica taking its own accumulation x microbatches of them, contiguous, one round after
  // another (docs/scenarios.md).
  if (s.StepMicrobatches() > s.batch) {
    std::vector<std::string> factors;
    if (s.data_parallel > 1) factors.push_back(fmt::format("data_parallel {}", s.data_parallel));
    if (s.accumulation > 1) factors.push_back(fmt::format("accumulation {}", s.accumulation));
    factors.push_back(fmt::format("microbatches {}", s.microbatches));
    const bool dp = s.data_parallel > 1;
    throw at.At(line, dp ? "data_parallel" : "accumulation", std::to_string(dp ? s.data_parallel : s.accumulation),
                fmt::format("{} = {} microbatches, more than batch {}: every microbatch needs a sequence",
                            fmt::join(factors, " x "), s.StepMicrobatches(), s.batch));
  }
  // The mixture of experts and its balance loss: pipecheck's trainer, PyTorch's pipelining and an
  // external trainer (handed config.json's model.moe). The framework adapters build dense models,
  // so their rows are refused rather than run dense.
  if (s.experts > 0 && s.trainer != "pipecheck" && s.trainer != "torch" && s.trainer.rfind("external:", 0) != 0) {
    throw at.At(line, "experts", std::to_string(s.experts),
                fmt::format("trainer {} is not given a mixture of experts: experts needs trainer pipecheck, torch or "
                            "external:PATH", s.trainer));
  }
  if (s.trainer == "torchtitan") CheckTorchTitan(s, line, at);
  if (s.trainer == "deepspeed" || s.trainer == "megatron") CheckFramework(s, line, at);
  // microbatch_mean: pipecheck's trainer, the reference and the frameworks whose default it is.
  if (s.loss == "microbatch_mean" && s.trainer != "pipecheck" && s.trainer != "deepspeed" && s.trainer != "megatron" &&
      s.trainer.rfind("external:", 0) != 0) {
    throw at.At(line, "loss", s.loss,
                fmt::format("trainer {} normalises by the batch's tokens: loss microbatch_mean needs trainer "
                            "pipecheck, deepspeed, megatron or external:PATH", s.trainer));
  }
  if (s.loss == "microbatch_mean" && s.fault == "mean_of_microbatch_means") {
    throw at.At(line, "fault", s.fault, "mean_of_microbatch_means is loss microbatch_mean's own rule, not a fault under it");
  }
}

// The schedule's rules on virtual stages: a V's fixed count (resolved here), and several stages
// per rank only where the schedule takes them.
void CheckVirtualStages(Scenario& s, unsigned line, const Locator& at) {
  const auto& rules = CurrentVocabulary()->schedule_rules;
  const auto rule = std::find_if(rules.begin(), rules.end(), [&](const ScheduleRule& r) { return r.name == s.schedule; });
  if (rule != rules.end() && rule->fixed_virtual_stages > 0) {
    // A V is two stages per rank: that count, or the column left out (resolved to it above); a
    // count given otherwise is refused, 1 included, rather than quietly taken as 2.
    if (s.virtual_stages != rule->fixed_virtual_stages) {
      throw at.At(line, "virtual_stages", std::to_string(s.virtual_stages),
                  fmt::format("schedule '{}' places {} stages per rank in a V: virtual_stages must be {} (or left out)",
                              s.schedule, rule->fixed_virtual_stages == 2 ? "two" : std::to_string(rule->fixed_virtual_stages),
                              rule->fixed_virtual_stages));
    }
    s.virtual_stages = rule->fixed_virtual_stages;
  }
  const bool several = pipeline::IsScheduleCsv(s.schedule) || (rule != rules.end() && rule->several_stages_per_rank);
  if (s.virtual_stages > 1 && !several) {
    std::vector<std::string> allowing;
    for (const auto& r : rules) {
      if (r.several_stages_per_rank) allowing.push_back(r.name);
    }
    throw at.At(line, "virtual_stages", std::to_string(s.virtual_stages),
                fmt::format("schedule '{}' runs one stage per rank; virtual stages need schedule {} (or a csv: "
                            "schedule)", s.schedule, fmt::join(allowing, " or ")));
  }
}

// Explicit partition counts: one per stage, adding up to the model's layers.
void CheckPartitionCounts(const Scenario& s, unsigned line, const Locator& at) {
  const auto counts = s.PartitionCounts();
  if (counts.empty()) return;
  const int64_t stages = s.world_size * s.virtual_stages;
  int64_t total = 0;
  for (int64_t count : counts) total += count;
  if (static_cast<int64_t>(counts.size()) != stages) {
    throw at.At(line, "partition", s.partition,
                fmt::format("{} counts given, but world_size {} x virtual_stages {} = {} stages", counts.size(),
                            s.world_size, s.virtual_stages, stages));
  }
  if (total != s.layers) {
    throw at.At(line, "partition", s.partition,
                fmt::format("the counts add up to {} layers, but the model has {}", total, s.layers));
  }
}

// The model's and the device's rules: tolerance and learning rate bounds, heads dividing hidden
// (evenly for llama's rotary embedding), a transport the device can use, lengths and microbatches
// the batch can hold.
void CheckModelAndDevice(const Scenario& s, unsigned line, const Locator& at) {
  const DtypeTraits& dtype = DtypeOf(s.dtype);
  if (s.tol > dtype.max_tol) {
    throw at.At(line, "tol", fmt::format("{}", s.tol),
                fmt::format("tol for {} must be at most {:g} (default {:g}): a looser tolerance would let real bugs "
                            "pass", s.dtype, dtype.max_tol, dtype.default_tol));
  }
  if (s.lr > kMaxLearningRate) {
    throw at.At(line, "lr", fmt::format("{}", s.lr),
                fmt::format("lr must be at most {:g}: larger rates only make both trainers diverge", kMaxLearningRate));
  }
  if (s.hidden % s.heads != 0) {
    throw at.At(line, "heads", std::to_string(s.heads), fmt::format("heads must divide hidden ({})", s.hidden));
  }
  if (s.kv_heads != 0 && s.heads % s.kv_heads != 0) {
    throw at.At(line, "kv_heads", std::to_string(s.kv_heads),
                fmt::format("kv_heads must divide heads ({}): each key/value head serves heads / kv_heads query heads",
                            s.heads));
  }
  if (s.kv_heads != 0 && s.kv_heads != s.heads && s.flavor != "llama") {
    throw at.At(line, "kv_heads", std::to_string(s.kv_heads),
                fmt::format("grouped-query attention is llama's; {} keeps a key/value head per query head", s.flavor));
  }
  if (s.experts == 1) {
    throw at.At(line, "experts", "1", "a mixture of experts needs at least 2 (0 keeps the dense MLP)");
  }
  if (s.experts > 0 && s.flavor != "llama") {
    throw at.At(line, "experts", std::to_string(s.experts),
                fmt::format("the mixture of experts is llama's; {} keeps its dense MLP", s.flavor));
  }
  if (s.experts > 0 && s.top_k > s.experts) {
    throw at.At(line, "top_k", std::to_string(s.top_k),
                fmt::format("a token cannot take more experts than the {} there are", s.experts));
  }
  if (s.experts > 0 && s.dense_layers >= s.layers) {
    throw at.At(line, "dense_layers", std::to_string(s.dense_layers),
                fmt::format("every one of the {} layers would be dense: no MoE layer is left", s.layers));
  }
  if (s.expert_bias > 0.0 && s.experts == 0) {
    throw at.At(line, "expert_bias", FormatReal(s.expert_bias), "the expert bias balances a mixture of experts: set experts");
  }
  if (s.expert_bias > 1.0) {
    throw at.At(line, "expert_bias", FormatReal(s.expert_bias), "at most 1: a step moves each bias by γ");
  }
  if (s.aux_loss > 1.0) {
    throw at.At(line, "aux_loss", FormatReal(s.aux_loss), "at most 1: the balance loss is a small share of the objective");
  }
  if (s.flavor == "llama" && (s.hidden / s.heads) % 2 != 0) {
    throw at.At(line, "heads", std::to_string(s.heads),
                fmt::format("llama's rotary embedding needs an even head dimension, but hidden {} / heads {} = {}",
                            s.hidden, s.heads, s.hidden / s.heads));
  }
  if (s.device == "cpu" && CurrentVocabulary()->device.empty() && (s.transport == "nccl" || s.transport == "staged")) {
    throw at.At(line, "transport", s.transport,
                fmt::format("{} moves CUDA tensors, but the scenario runs on cpu; use gloo or auto", s.transport));
  }
  if (s.device == "cuda" && s.transport == "gloo") {
    throw at.At(line, "transport", s.transport,
                "c10d's Gloo cannot send CUDA tensors; use nccl (a GPU per rank), staged (ranks sharing GPUs) or auto");
  }
  if (s.seq_len_min > s.seq_len) {
    throw at.At(line, "seq_len_min", std::to_string(s.seq_len_min),
                fmt::format("seq_len_min must not exceed seq_len ({})", s.seq_len));
  }
  if (s.microbatches > s.batch) {
    throw at.At(line, "microbatches", std::to_string(s.microbatches),
                fmt::format("microbatches must not exceed batch ({}): every microbatch needs a sequence", s.batch));
  }
}

// The columns a resume may change: the layout, never the model, data, optimizer or seed
// (harness/resume.cc takes these, and only these, from each layout).
const std::vector<std::string>& ResumeColumns() {
  static const std::vector<std::string> columns = {"world_size",    "schedule",  "virtual_stages", "partition",
                                                   "data_parallel", "recompute", "accumulation"};
  return columns;
}

void CheckCombinations(Scenario& s, unsigned line, const Locator& at);

// `resume`: each STEP[:COLUMN=VALUE;...], the steps rising inside [1, steps), its layout built
// from the one before and held to every rule a row's layout is held to (s.layouts).
void CheckResume(Scenario& s, unsigned line, const Locator& at) {
  s.resumes.clear();
  s.layouts.clear();
  if (s.resume.empty()) return;
  const auto fail = [&](const std::string& problem) { return at.At(line, "resume", s.resume, problem); };
  std::stringstream parts(s.resume);
  std::string part;
  Scenario previous = s;
  previous.resume.clear();
  int64_t last_step = 0;
  while (std::getline(parts, part, '|')) {
    part = Trim(part);
    const auto colon = part.find(':');
    Scenario::Resume resume;
    int64_t step = 0;
    try {
      step = ParseInteger(Trim(part.substr(0, colon)), 1, kMaxSteps);
    } catch (const ValueProblem& problem) {
      throw fail(fmt::format("'{}': the step: {}", part, problem.what));
    }
    if (step <= last_step || step >= s.steps) {
      throw fail(fmt::format("'{}': a resume after step {} must come after the previous one ({}) and before the "
                             "last step ({} steps)", part, step, last_step, s.steps));
    }
    resume.step = last_step = step;
    Scenario layout = previous;
    bool virtual_stages_given = false;
    if (colon != std::string::npos) {
      // Settings are joined by ';', which also joins a partition's counts: a piece without '='
      // continues the setting before it (`partition=1;3;world_size=2`).
      std::stringstream pieces(part.substr(colon + 1));
      std::vector<std::string> settings;
      std::string piece;
      while (std::getline(pieces, piece, ';')) {
        piece = Trim(piece);
        if (piece.find('=') == std::string::npos && !settings.empty()) {
          settings.back() += ";" + piece;
        } else {
          settings.push_back(piece);
        }
      }
      for (const std::string& setting : settings) {
        const auto equals = setting.find('=');
        const std::string column = Trim(setting.substr(0, equals));
        const auto& allowed = ResumeColumns();
        if (equals == std::string::npos || std::find(allowed.begin(), allowed.end(), column) == allowed.end()) {
          throw fail(fmt::format("'{}': a resume sets COLUMN=VALUE of the layout ({}); the model, data, optimizer "
                                 "and seed stay the row's", setting, fmt::join(allowed, ", ")));
        }
        const std::string value = Trim(setting.substr(equals + 1));
        const auto found = std::find_if(Columns().begin(), Columns().end(),
                                        [&](const Column& c) { return c.name == column; });
        try {
          found->parse(layout, value);
        } catch (const ValueProblem& problem) {
          throw fail(fmt::format("'{}': {}", setting, problem.what));
        }
        virtual_stages_given = virtual_stages_given || column == "virtual_stages";
        if (column == "schedule") {  // csv:PATH, relative to the suite file as the row's own
          layout.schedule_written = layout.schedule;
          const std::filesystem::path path = pipeline::ScheduleCsvPath(layout.schedule).value_or("");
          if (!path.empty() && path.is_relative()) {
            const std::string file = s.source.substr(0, s.source.rfind(':'));
            layout.schedule = pipeline::ScheduleCsvName((std::filesystem::path(file).parent_path() / path).string());
          }
        }
        resume.settings.emplace_back(column, value);
      }
    }
    // A new schedule without virtual_stages takes the schedule's own default, as a row does.
    const auto& rules = CurrentVocabulary()->schedule_rules;
    const auto rule = std::find_if(rules.begin(), rules.end(), [&](const ScheduleRule& r) { return r.name == layout.schedule; });
    if (!virtual_stages_given && layout.schedule != previous.schedule && rule != rules.end()) {
      layout.virtual_stages = rule->default_virtual_stages;
    }
    try {
      CheckCombinations(layout, line, at);
    } catch (const ScenarioError& error) {
      throw fail(fmt::format("the layout after step {} breaks a rule: {}", step, error.what()));
    }
    s.resumes.push_back(resume);
    s.layouts.push_back(layout);
    previous = layout;
  }
}

// Rules that involve several columns; defaults resolved first. Independent rules, each naming the
// columns it relates, in the order the first broken one is reported.
void CheckCombinations(Scenario& s, unsigned line, const Locator& at) {
  if (s.seq_len_min == 0) s.seq_len_min = s.seq_len;
  if (s.tol == 0.0) s.tol = DtypeOf(s.dtype).default_tol;
  CheckModelAndDevice(s, line, at);
  CheckTrainer(s, line, at);
  CheckVirtualStages(s, line, at);
  if (CurrentVocabulary()->schedule_problem) {
    const std::string problem = CurrentVocabulary()->schedule_problem(s);
    if (!problem.empty()) throw at.At(line, "schedule", s.schedule, problem);
  }
  CheckLayout(s, line, at);
  CheckPartitionCounts(s, line, at);
  if (!s.resume.empty()) CheckResume(s, line, at);
}

using Reader = io::CSVReader<kColumnCount, io::trim_chars<' ', '\t'>, io::double_quote_escape<',', '"'>,
                             io::throw_on_overflow, io::single_and_empty_line_comment<'#'>>;

template <size_t... I>
void ReadFccpHeader(Reader& reader, std::index_sequence<I...>) {
  reader.read_header(io::ignore_missing_column, Columns()[I].name...);
}

template <size_t... I>
bool ReadFccpRow(Reader& reader, std::array<std::string, kColumnCount>& cells, std::index_sequence<I...>) {
  return reader.read_row(cells[I]...);
}

Scenario ParseRow(const std::array<std::string, kColumnCount>& cells, const Header& header, unsigned line,
                  const std::string& file, const Locator& at) {
  Scenario scenario;
  scenario.source = fmt::format("{}:{}", file, line);
  scenario.column_positions = header.positions;
  bool virtual_stages_given = false;
  for (size_t i = 0; i < kColumnCount; ++i) {
    const std::string& column = Columns()[i].name;
    const bool present = header.positions.count(column) > 0;
    if (!present || cells[i].empty()) {
      if (column == "name") throw at.At(line, column, cells[i], "every scenario needs a name");
      continue;  // the column's default
    }
    virtual_stages_given = virtual_stages_given || column == "virtual_stages";
    try {
      Columns()[i].parse(scenario, cells[i]);
    } catch (const ValueProblem& problem) {
      throw at.At(line, column, cells[i], problem.what);
    }
  }
  scenario.schedule_written = scenario.schedule;
  if (const auto written = pipeline::ScheduleCsvPath(scenario.schedule)) {
    const std::filesystem::path path = *written;
    if (path.is_relative()) {
      scenario.schedule = pipeline::ScheduleCsvName((std::filesystem::path(file).parent_path() / path).string());
    }
  }
  const std::string external = "external:";
  if (scenario.trainer.rfind(external, 0) == 0) {
    const std::filesystem::path path = scenario.trainer.substr(external.size());
    scenario.trainer_path = path.is_relative() ? (std::filesystem::path(file).parent_path() / path).string() : path.string();
  }
  // Left out, virtual_stages is the schedule's own default (interleaved runs two stages per rank).
  const auto& rules = CurrentVocabulary()->schedule_rules;
  const auto rule = std::find_if(rules.begin(), rules.end(), [&](const ScheduleRule& r) { return r.name == scenario.schedule; });
  if (!virtual_stages_given && rule != rules.end()) scenario.virtual_stages = rule->default_virtual_stages;
  if (!CurrentVocabulary()->device.empty()) scenario.device = CurrentVocabulary()->device;
  CheckCombinations(scenario, line, at);
  return scenario;
}

}  // namespace

std::vector<int64_t> Scenario::PartitionCounts() const {
  std::vector<int64_t> counts;
  if (partition == "uniform" || partition == "params") return counts;
  std::stringstream stream(partition);
  std::string count;
  while (std::getline(stream, count, ';')) counts.push_back(std::stoll(count));
  return counts;
}

const std::vector<std::string>& ColumnNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const auto& column : Columns()) list.push_back(column.name);
    return list;
  }();
  return names;
}

std::vector<std::pair<std::string, std::string>> ColumnValues(const Scenario& scenario) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& column : Columns()) values.emplace_back(column.name, column.format(scenario));
  return values;
}

std::vector<std::pair<std::string, std::string>> SummaryValues(const Scenario& scenario) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& column : Columns()) {
    if (!column.summary) continue;
    if (column.name == "name") {
      values.emplace_back("scenario", scenario.name);
    } else if (column.name == "schedule" && !scenario.schedule_written.empty()) {
      values.emplace_back(column.name, scenario.schedule_written);  // csv:PATH as the suite wrote it
    } else {
      values.emplace_back(column.name, column.format(scenario));
    }
  }
  return values;
}

std::string ColumnsMarkdown(const Vocabulary& vocabulary) {
  const auto cell = [](std::string text) {
    for (size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2)) text.insert(at, "\\");
    return text;
  };
  static const Scenario defaults;
  std::string text = "| column | default | values | what it sets |\n| --- | --- | --- | --- |\n";
  for (const auto& column : Columns()) {
    std::string shown = column.default_shown.empty() ? column.format(defaults) : column.default_shown;
    if (shown.empty()) shown = "(empty)";
    text += fmt::format("| `{}` | {} | {} | {} |\n", column.name, cell(shown), cell(column.values(vocabulary)),
                        cell(column.meaning));
  }
  return text;
}

std::string ValuePlace(const Scenario& scenario, const std::string& column) {
  std::string value;
  for (const auto& [name, text] : ColumnValues(scenario)) {
    if (name == column) value = text;
  }
  const auto found = scenario.column_positions.find(column);
  if (found == scenario.column_positions.end()) {
    return fmt::format("{}: column '{}' (not in file, default '{}')", scenario.source, column, value);
  }
  return fmt::format("{}:{}: column '{}', value '{}'", scenario.source, found->second, column, value);
}

std::string Fingerprint(const std::string& configuration) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char c : configuration) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return fmt::format("{:016x}", hash);
}

std::string Configuration(const Scenario& scenario) {
  static const Scenario defaults;
  std::vector<std::string> pairs;
  const auto schedule_file = pipeline::ScheduleCsvPath(scenario.schedule);
  for (const auto& column : Columns()) {
    if (column.configuration == InConfiguration::kNever) continue;
    const std::string value = column.format(scenario);
    if (column.configuration == InConfiguration::kUnlessDefault && value == column.format(defaults)) continue;
    std::string shown = value;
    if (column.name == "schedule" && schedule_file) {
      std::ifstream stream(*schedule_file, std::ios::binary);
      std::stringstream contents;
      contents << stream.rdbuf();
      shown = fmt::format("{}#{}", scenario.schedule_written.empty() ? value : scenario.schedule_written,
                          Fingerprint(contents.str()));
    }
    pairs.push_back(column.name + "=" + shown);
  }
  return fmt::format("{}", fmt::join(pairs, " "));
}

namespace {

// A cell as the loader reads it back: quoted (quotes doubled) where it holds a comma or a quote.
std::string CsvCell(const std::string& value) {
  if (value.find_first_of(",\"") == std::string::npos) return value;
  std::string quoted = "\"";
  for (const char c : value) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

std::string ToCsv(const std::vector<Scenario>& scenarios) {
  std::string text = fmt::format("{}\n", fmt::join(ColumnNames(), ","));
  for (const auto& scenario : scenarios) {
    std::vector<std::string> cells;
    for (size_t i = 0; i < kColumnCount; ++i) cells.push_back(CsvCell(Columns()[i].format(scenario)));
    text += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return text;
}


std::vector<Scenario> ParseScenarios(const std::string& raw_text, const std::string& file,
                                     const Vocabulary& vocabulary) {
  // For this parse only: the columns that name schedules and faults check against it.
  struct Scope {
    explicit Scope(const Vocabulary& v) : previous(CurrentVocabulary()) { CurrentVocabulary() = &v; }
    ~Scope() { CurrentVocabulary() = previous; }
    const Vocabulary* previous;
  } scope(vocabulary);
  if (raw_text.find('\0') != std::string::npos) {
    throw ScenarioError(fmt::format("{}: not a text file (it holds NUL bytes): expected a scenario CSV", file));
  }
  const std::string text = SuiteTextAsRead(raw_text);
  RejectQuotedLineBreaks(text, file);
  const Header header = ReadHeader(file, text);
  const Locator at(file, header);
  std::vector<Scenario> scenarios;
  std::map<std::string, unsigned> first_line;
  try {
    Reader reader(file, text.data(), text.data() + text.size());
    ReadFccpHeader(reader, std::make_index_sequence<kColumnCount>());
    std::array<std::string, kColumnCount> cells;
    while (true) {
      cells.fill("");
      if (!ReadFccpRow(reader, cells, std::make_index_sequence<kColumnCount>())) break;
      const unsigned line = reader.get_file_line();
      Scenario scenario = ParseRow(cells, header, line, file, at);
      auto [previous, inserted] = first_line.emplace(scenario.name, line);
      if (!inserted) {
        throw at.At(line, "name", scenario.name,
                    fmt::format("duplicate scenario name (first defined on line {})", previous->second));
      }
      scenarios.push_back(std::move(scenario));
    }
  } catch (const io::error::too_few_columns& error) {
    throw at.AtLine(error.file_line, fmt::format("too few fields: the header has {} columns", header.positions.size()));
  } catch (const io::error::too_many_columns& error) {
    throw at.AtLine(error.file_line, fmt::format("too many fields: the header has {} columns", header.positions.size()));
  } catch (const io::error::escaped_string_not_closed& error) {
    throw at.AtLine(error.file_line, "a quoted field is not closed");
  } catch (const io::error::base& error) {
    throw ScenarioError(fmt::format("{}: {}", file, error.what()));
  }
  if (scenarios.empty()) {
    throw at.AtLine(header.line, "the file has a header but no scenario rows");
  }
  return scenarios;
}

namespace {
std::atomic<int64_t> g_suites_loaded{0};
}  // namespace

int64_t SuitesLoaded() { return g_suites_loaded.load(); }

std::string ReadSuiteText(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw ScenarioError(fmt::format("{}: is a directory: expected a scenario CSV file", path));
  }
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw ScenarioError(fmt::format("{}: cannot open scenario file: {}", path, std::strerror(errno)));
  // Read at most kMaxSuiteBytes + 1: a suite is text of a few kilobytes, and /dev/zero is not one.
  std::string contents(kMaxSuiteBytes + 1, '\0');
  stream.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  contents.resize(static_cast<size_t>(stream.gcount()));
  if (contents.size() > kMaxSuiteBytes) {
    throw ScenarioError(fmt::format("{}: larger than {} MiB: not a scenario suite", path, kMaxSuiteBytes >> 20));
  }
  return contents;
}

std::string SuiteTextAsRead(const std::string& raw_text) {
  // A UTF-8 byte-order mark (spreadsheets write one) is no part of the first column's name.
  const bool bom = raw_text.rfind("\xEF\xBB\xBF", 0) == 0;
  return NormaliseLines(bom ? raw_text.substr(3) : raw_text);
}

std::vector<Scenario> LoadScenarios(const std::string& path, const Vocabulary& vocabulary) {
  ++g_suites_loaded;
  return ParseScenarios(ReadSuiteText(path), path, vocabulary);
}

std::vector<Scenario> SelectScenarios(const std::vector<Scenario>& scenarios, const std::string& globs,
                                      const std::string& path) {
  std::vector<std::string> patterns;
  std::stringstream stream(globs);
  std::string pattern;
  while (std::getline(stream, pattern, ',')) {
    if (!pattern.empty()) patterns.push_back(pattern);
  }
  std::vector<Scenario> selected;
  std::vector<bool> used(patterns.size(), false);
  for (const auto& scenario : scenarios) {
    bool match = patterns.empty();
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (fnmatch(patterns[i].c_str(), scenario.name.c_str(), 0) == 0) match = used[i] = true;
    }
    if (match) selected.push_back(scenario);
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (!used[i]) {
      throw ScenarioError(fmt::format("{}: no scenario matches --only '{}'{}", path, patterns[i],
                                      patterns.size() > 1 ? fmt::format(" (of '{}')", globs) : ""));
    }
  }
  return selected;
}

const Scenario& FindScenario(const std::vector<Scenario>& scenarios, const std::string& name,
                             const std::string& path) {
  for (const auto& scenario : scenarios) {
    if (scenario.name == name) return scenario;
  }
  throw ScenarioError(fmt::format("{}: no scenario named '{}'", path, name));
}

}  // namespace pipecheck::scenarios
