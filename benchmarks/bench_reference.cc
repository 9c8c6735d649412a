// One reference training step (forward, backward, AdamW) at two sizes: the core config and a
// larger float32 one. Reports times; asserts nothing.
#include <benchmark/benchmark.h>
#include <torch/types.h>

#include "reference/trainer.h"

namespace {

using pipecheck::reference::ReferenceTrainer;
using pipecheck::reference::TrainConfig;

void RunSteps(benchmark::State& state, const TrainConfig& config) {
  ReferenceTrainer trainer(config);
  trainer.Step(0);  // warm-up: allocator and optimizer state
  int64_t step = 1;
  int64_t tokens = 0;
  for (auto _ : state) {
    const auto record = trainer.Step(step++);
    tokens += record.tokens;
    benchmark::DoNotOptimize(record.loss);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

// docs/scenarios.md's defaults: llama, 4 layers, hidden 64, 4 heads, batch 8, seq_len 32, float64.
void BM_ReferenceStep_Core(benchmark::State& state) {
  TrainConfig config;
  config.record_gradients = false;
  RunSteps(state, config);
}

void BM_ReferenceStep_L8H256T128_Float32(benchmark::State& state) {
  TrainConfig config;
  config.model.layers = 8;
  config.model.hidden = 256;
  config.model.max_seq_len = 128;
  config.data.seq_len = 128;
  config.data.seq_len_min = 128;
  config.data.batch = 8;
  config.dtype = torch::kFloat32;
  config.record_gradients = false;
  RunSteps(state, config);
}

BENCHMARK(BM_ReferenceStep_Core)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReferenceStep_L8H256T128_Float32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
