// The pipeline executor's own cost at world size 1: one pipeline step (schedule interpreted,
// caches, checks) against a plain single-device loop over the same microbatches with the
// same model, loss and optimizer. Their ratio is the executor's overhead. Reports only.
#include <benchmark/benchmark.h>
#include <torch/types.h>

#include "pipeline/trainer.h"
#include "pipeline/transport.h"
#include "reference/loss.h"

namespace {

using namespace pipecheck;

// Core-sized model (docs/scenarios.md defaults) in float32, 4 microbatches.
pipeline::PipelineConfig Config() {
  pipeline::PipelineConfig config;
  config.train.dtype = torch::kFloat32;
  config.train.record_gradients = false;
  config.train.model.layers = 4;
  config.train.model.hidden = 128;
  config.train.model.heads = 4;
  config.train.model.max_seq_len = 64;
  config.train.data.seq_len = 64;
  config.train.data.seq_len_min = 64;
  config.train.data.batch = 8;
  config.microbatches = 4;
  config.world_size = 1;
  config.schedule = "1f1b";
  return config;
}

void BM_PipelineStep_WorldSize1(benchmark::State& state) {
  const auto config = Config();
  auto transport = pipeline::ConnectGloo({});
  pipeline::PipelineTrainer trainer(config, *transport);
  pipeline::RankResult result;
  int64_t step = 0;
  trainer.Step(step++, result);  // warm-up
  for (auto _ : state) trainer.Step(step++, result);
}

// The same work without the pipeline machinery: accumulate over microbatches, then step.
void BM_PlainLoop_SameMicrobatches(benchmark::State& state) {
  const auto config = Config();
  const auto& train = config.train;
  auto model = reference::BuildSlice(train.model, reference::WholeModel(train.model), train.seed, train.dtype,
                                     train.device);
  auto parameters = model->parameters();
  auto optimizer = reference::MakeOptimizer(train.optimizer, parameters);
  auto run_step = [&](int64_t step) {
    const auto batch = reference::MakeBatch(train.data, train.seed, step);
    for (auto& parameter : parameters) parameter.mutable_grad().reset();
    for (const auto& part : reference::SplitMicrobatches(batch, config.microbatches)) {
      auto context = reference::MakeAttentionContext(train.model, part.lengths, part.time(), train.dtype, train.device);
      auto loss = reference::TokenLossSum(model->forward(part.tokens, context), part.labels) /
                  static_cast<double>(batch.valid_tokens);
      loss.backward();
    }
    reference::ScaleGradients(parameters, reference::ClipFactor(std::sqrt(reference::GradSquaredSum(parameters)), 0));
    optimizer->step();
  };
  int64_t step = 0;
  run_step(step++);  // warm-up
  for (auto _ : state) run_step(step++);
}

BENCHMARK(BM_PipelineStep_WorldSize1)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_PlainLoop_SameMicrobatches)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(5)
    ->ReportAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
