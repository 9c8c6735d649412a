// The scenario loader: defaults, and every class of bad input with the exact location and
// what is allowed in the message.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "reports/csv.h"
#include "reports/report.h"
#include "scenarios/dtypes.h"
#include "scenarios/scenario.h"
#include "harness/scenario_model.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

using harness::ParseSuite;
using scenarios::ScenarioError;
using scenarios::Configuration;
using scenarios::Fingerprint;

// The message ParseScenarios throws for `text`, or "" when it loads.
std::string ErrorFor(const std::string& text) {
  try {
    ParseSuite(text, "suite.csv");
  } catch (const ScenarioError& error) {
    return error.what();
  }
  return "";
}

// expect=OUTCOME<MAJOR.MINOR: the outcome on a PyTorch older than that, the other one from it on,
// resolved against the PyTorch this build links; the suite's words are kept beside.
TEST(ScenarioLoader, VersionedExpectationsResolveAgainstTheBuildsPyTorch) {
  auto vocabulary = harness::PipelineVocabulary();
  EXPECT_EQ(vocabulary.torch_version, std::make_pair(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
  const std::string text = "name,expect\nold,fail<2.15\nnew,pass<2.15\nplain,fail\n";
  vocabulary.torch_version = {2, 11};
  auto suite = scenarios::ParseScenarios(text, "v.csv", vocabulary);
  EXPECT_EQ(suite[0].expect, "fail");
  EXPECT_EQ(suite[1].expect, "pass");
  EXPECT_EQ(suite[2].expect, "fail");
  EXPECT_EQ(suite[0].expect_written, "fail<2.15");
  vocabulary.torch_version = {2, 15};
  suite = scenarios::ParseScenarios(text, "v.csv", vocabulary);
  EXPECT_EQ(suite[0].expect, "pass");
  EXPECT_EQ(suite[1].expect, "fail");
  EXPECT_EQ(suite[2].expect, "fail");
  vocabulary.torch_version = {3, 0};
  EXPECT_EQ(scenarios::ParseScenarios(text, "v.csv", vocabulary)[0].expect, "pass");
}

TEST(ScenarioLoader, AppliesDefaultsAndResolvesDependentOnes) {
  const auto suite = ParseSuite("name\nplain\n", "suite.csv");
  ASSERT_EQ(suite.size(), 1u);
  const auto& s = suite[0];
  EXPECT_EQ(s.flavor, "llama");
  EXPECT_EQ(s.layers, 4);
  EXPECT_EQ(s.hidden, 64);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.schedule, "1f1b");
  EXPECT_EQ(s.seq_len_min, 32);
  EXPECT_EQ(s.dtype, "float64");
  EXPECT_DOUBLE_EQ(s.tol, 1e-9);
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.expect, "pass");
  EXPECT_EQ(s.source, "suite.csv:2");
}

TEST(ScenarioLoader, ReadsEveryColumnWithQuotesCommentsAndBlankLines) {
  const std::string text =
      "# a comment\n"
      "\n"
      "name,flavor,layers,hidden,heads,ffn,vocab,tied,world_size,schedule,virtual_stages,partition,batch,"
      "microbatches,seq_len,seq_len_min,dtype,steps,optimizer,lr,clip,recompute,seed,device,tol,fault,expect\n"
      "# another\n"
      "full,gpt2,3,48,6,100,99,1,4,gpipe,1,\"1;0;2;0\",9,5,20,3,float32,3,sgd,0.25,1.5,0,18446744073709551615,"
      "cpu,2e-4,none,fail\n"
      "dtype_tol , llama , 2 ,,,,,,,,,,,,,,bfloat16,,,,,,,,,,\n";
  const auto suite = ParseSuite(text, "suite.csv");
  ASSERT_EQ(suite.size(), 2u);
  const auto& s = suite[0];
  EXPECT_EQ(s.flavor, "gpt2");
  EXPECT_EQ(s.ffn, 100);
  EXPECT_TRUE(s.tied);
  EXPECT_EQ(s.partition, "1;0;2;0");
  EXPECT_EQ(s.PartitionCounts(), (std::vector<int64_t>{1, 0, 2, 0}));
  EXPECT_EQ(s.seq_len_min, 3);
  EXPECT_DOUBLE_EQ(s.lr, 0.25);
  EXPECT_FALSE(s.recompute);
  EXPECT_EQ(s.seed, 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(s.tol, 2e-4);
  EXPECT_EQ(s.expect, "fail");
  EXPECT_EQ(s.source, "suite.csv:5");
  EXPECT_EQ(suite[1].name, "dtype_tol");
  EXPECT_EQ(suite[1].layers, 2);
  EXPECT_DOUBLE_EQ(suite[1].tol, 3e-2);
}

TEST(ScenarioLoader, ColumnValuesRoundTrip) {
  const auto original = ParseSuite("name,lr,partition,world_size,layers\nx,0.003,2;1,2,3\n", "a.csv")[0];
  const auto again = ParseSuite(testing::ScenariosCsv({original}), "b.csv")[0];
  EXPECT_EQ(scenarios::ColumnValues(again), scenarios::ColumnValues(original));
}

TEST(ScenarioLoader, RejectsUnknownColumnNamingItsPosition) {
  EXPECT_EQ(ErrorFor("# c\nname,layers,colour\nx,2,red\n").rfind("suite.csv:2:3: unknown column 'colour'; allowed columns: name, flavor,", 0), 0u)
      << ErrorFor("# c\nname,layers,colour\nx,2,red\n");
}

TEST(ScenarioLoader, RejectsDuplicateColumn) {
  EXPECT_EQ(ErrorFor("name,layers,layers\nx,2,3\n"),
            "suite.csv:1:3: column 'layers' appears twice (first at column 2)");
}

TEST(ScenarioLoader, RejectsHeaderWithoutName) {
  EXPECT_EQ(ErrorFor("layers\n2\n"), "suite.csv:1: the header has no 'name' column (it is required)");
}

TEST(ScenarioLoader, RejectsEmptyFilesAndFilesWithoutRows) {
  EXPECT_EQ(ErrorFor(""), "suite.csv: empty file: expected a header row naming the columns (at least 'name')");
  EXPECT_EQ(ErrorFor("# only a comment\n\n"),
            "suite.csv: empty file: expected a header row naming the columns (at least 'name')");
  EXPECT_EQ(ErrorFor("name,layers\n# nothing\n"), "suite.csv:1: the file has a header but no scenario rows");
}

TEST(ScenarioLoader, RejectsDuplicateAndMissingNames) {
  EXPECT_EQ(ErrorFor("name\na\nb\na\n"),
            "suite.csv:4:1: column 'name', value 'a': duplicate scenario name (first defined on line 2)");
  EXPECT_EQ(ErrorFor("layers,name\n2,\n"), "suite.csv:2:2: column 'name', value '': every scenario needs a name");
  EXPECT_EQ(ErrorFor("name\nhas space\n"),
            "suite.csv:2:1: column 'name', value 'has space': expected a name of 1 to 100 letters, digits, "
            "'_', '.' and '-', other than '.' and '..'");
}

TEST(ScenarioLoader, RejectsBadNumbers) {
  EXPECT_EQ(ErrorFor("name,layers\nx,abc\n"),
            "suite.csv:2:2: column 'layers', value 'abc': expected an integer in [1, 1024]");
  EXPECT_EQ(ErrorFor("name,layers\nx,0\n"),
            "suite.csv:2:2: column 'layers', value '0': expected an integer in [1, 1024]");
  EXPECT_EQ(ErrorFor("name,batch\nx,4.5\n"),
            "suite.csv:2:2: column 'batch', value '4.5': expected an integer in [1, 65536]");
  EXPECT_EQ(ErrorFor("name,lr\nx,0\n"), "suite.csv:2:2: column 'lr', value '0': expected a finite number > 0");
  EXPECT_EQ(ErrorFor("name,lr\nx,nan\n"), "suite.csv:2:2: column 'lr', value 'nan': expected a finite number > 0");
  EXPECT_EQ(ErrorFor("name,clip\nx,-1\n"),
            "suite.csv:2:2: column 'clip', value '-1': expected a finite number >= 0");
  EXPECT_EQ(ErrorFor("name,seed\nx,-3\n"),
            "suite.csv:2:2: column 'seed', value '-3': expected an integer in [0, 2^64 - 1]");
  EXPECT_EQ(ErrorFor("name,tied\nx,yes\n"), "suite.csv:2:2: column 'tied', value 'yes': expected 0 or 1");
}

TEST(ScenarioLoader, RejectsUnknownEnumValuesListingTheAllowedOnes) {
  EXPECT_EQ(ErrorFor("name,flavor\nx,bert\n"),
            "suite.csv:2:2: column 'flavor', value 'bert': expected one of: llama, gpt2");
  EXPECT_EQ(ErrorFor("name,schedule\nx,zigzag\n"),
            "suite.csv:2:2: column 'schedule', value 'zigzag': expected one of: gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev, "
            "loopedbfs");
  // zbv is two stages per rank: its virtual_stages is 2 when left out, and nothing else when given
  // (an explicit 1 was once taken as 2 without a word).
  EXPECT_EQ(ErrorFor("name,schedule,virtual_stages\nx,zbv,3\n"),
            "suite.csv:2:3: column 'virtual_stages', value '3': schedule 'zbv' places two stages per rank in a V: "
            "virtual_stages must be 2 (or left out)");
  EXPECT_EQ(ErrorFor("name,schedule,virtual_stages\nx,dualpipev,1\n"),
            "suite.csv:2:3: column 'virtual_stages', value '1': schedule 'dualpipev' places two stages per rank in a "
            "V: virtual_stages must be 2 (or left out)");
  EXPECT_EQ(harness::ParseSuite("name,schedule,virtual_stages\nx,zbv,\n", "s.csv")[0].virtual_stages, 2);
  EXPECT_EQ(harness::ParseSuite("name,schedule,world_size,partition\nx,zbv,2,1;1;1;1\n", "s.csv")[0].virtual_stages, 2);
  EXPECT_EQ(ErrorFor("name,schedule,world_size,virtual_stages,batch,microbatches\nx,interleaved,4,2,8,6\n"),
            "suite.csv:2:2: column 'schedule', value 'interleaved': interleaved needs microbatches to be a multiple "
            "of the ranks, as Megatron's and PyTorch's interleaved schedules do (got 6 microbatches on 4 ranks)");
  EXPECT_EQ(ErrorFor("name,schedule\nx,csv:\n"),
            "suite.csv:2:2: column 'schedule', value 'csv:': csv: needs the schedule file's path, as csv:PATH");
  EXPECT_EQ(ErrorFor("name,dtype\nx,float16\n"),
            "suite.csv:2:2: column 'dtype', value 'float16': expected one of: float64, float32, bfloat16");
  EXPECT_EQ(ErrorFor("name,expect\nx,maybe\n"),
            "suite.csv:2:2: column 'expect', value 'maybe': expected pass, fail, or OUTCOME<MAJOR.MINOR (fail<2.15: fail "
            "on PyTorch older than 2.15, pass from 2.15 on)");
  for (const std::string bad : {"fail<", "fail<2", "fail<2.", "fail<.15", "fail<2.15.1", "maybe<2.15", "fail<2.x",
                                "fail<2.1234567890"}) {
    EXPECT_NE(ErrorFor("name,expect\nx," + bad + "\n").find("value '" + bad + "': expected pass, fail, or OUTCOME<"),
              std::string::npos)
        << bad;
  }
  EXPECT_EQ(ErrorFor("name,partition\nx,2;;1\n"),
            "suite.csv:2:2: column 'partition', value '2;;1': expected uniform, params, or layer counts per stage "
            "such as 2;0;3;1");
}

TEST(ScenarioLoader, TrainersAndTheColumnsThatDependOnThem) {
  const auto suite = ParseSuite(
      "name,trainer,schedule,fault,note\n"
      "ours,,1f1b,drop_microbatch,\n"
      "theirs,torch,loopedbfs,stock_p2p_init,\"a note, with a comma\"\n"
      "mine,external:bin/train.py,gpipe,anything_it_knows,\n",
      "dir/suite.csv");
  ASSERT_EQ(suite.size(), 3u);
  EXPECT_EQ(suite[0].trainer, "pipecheck");
  EXPECT_FALSE(suite[0].ExternalTrainer());
  EXPECT_EQ(suite[1].trainer, "torch");
  EXPECT_EQ(suite[1].virtual_stages, 2) << "LoopedBFS runs two stages per rank unless told";
  EXPECT_EQ(suite[1].fault, "stock_p2p_init") << "another trainer's faults are its own to know";
  EXPECT_EQ(suite[1].note, "a note, with a comma");
  EXPECT_EQ(suite[2].trainer, "external:bin/train.py");
  EXPECT_EQ(suite[2].trainer_path, "dir/bin/train.py") << "resolved against the suite's folder";
  // The configuration (and fingerprint) names another trainer, and leaves pipecheck's rows as they were.
  EXPECT_EQ(scenarios::Configuration(suite[0]).find("trainer="), std::string::npos);
  EXPECT_NE(scenarios::Configuration(suite[1]).find("trainer=torch"), std::string::npos);
  EXPECT_EQ(scenarios::Configuration(suite[1]).find("note="), std::string::npos);

  EXPECT_EQ(ErrorFor("name,trainer\nx,megatrom\n"),
            "suite.csv:2:2: column 'trainer', value 'megatrom': expected one of: pipecheck, torch, torchtitan, "
            "deepspeed, megatron, external:PATH");
  EXPECT_EQ(ErrorFor("name,trainer\nx,external:\n"),
            "suite.csv:2:2: column 'trainer', value 'external:': external: needs the trainer program's path, as "
            "external:PATH");
  EXPECT_EQ(ErrorFor("name,schedule\nx,loopedbfs\n"), "") << "pipecheck's trainer runs looped BFS too";
  EXPECT_EQ(ErrorFor("name,fault\nx,stock_p2p_init\n").rfind(
                "suite.csv:2:2: column 'fault', value 'stock_p2p_init': expected one of: none, ", 0),
            0u) << "pipecheck's own trainer injects only its own faults";
  EXPECT_EQ(ErrorFor("name,trainer,fault\nx,torch,Bad-Name\n"),
            "suite.csv:2:3: column 'fault', value 'Bad-Name': expected a fault's name: lower-case letters, digits and "
            "'_'");
}

TEST(ScenarioLoader, GroupedQueryAttentionAndMixtureOfExpertsAreLlamasAndConsistent) {
  EXPECT_EQ(ErrorFor("name,heads,kv_heads\nx,4,2\n"), "");
  EXPECT_EQ(ErrorFor("name,heads,kv_heads\nx,4,3\n"),
            "suite.csv:2:3: column 'kv_heads', value '3': kv_heads must divide heads (4): each key/value head serves "
            "heads / kv_heads query heads");
  EXPECT_EQ(ErrorFor("name,flavor,kv_heads\nx,gpt2,2\n"),
            "suite.csv:2:3: column 'kv_heads', value '2': grouped-query attention is llama's; gpt2 keeps a key/value "
            "head per query head");
  EXPECT_EQ(ErrorFor("name,experts,top_k,dense_layers,shared_experts,router,aux_loss\nx,4,2,1,1,sigmoid,0.05\n"), "");
  EXPECT_EQ(ErrorFor("name,experts\nx,1\n"),
            "suite.csv:2:2: column 'experts', value '1': a mixture of experts needs at least 2 (0 keeps the dense MLP)");
  EXPECT_EQ(ErrorFor("name,flavor,experts\nx,gpt2,4\n"),
            "suite.csv:2:3: column 'experts', value '4': the mixture of experts is llama's; gpt2 keeps its dense MLP");
  EXPECT_EQ(ErrorFor("name,experts,top_k\nx,4,5\n"),
            "suite.csv:2:3: column 'top_k', value '5': a token cannot take more experts than the 4 there are");
  EXPECT_EQ(ErrorFor("name,layers,experts,dense_layers\nx,4,4,4\n"),
            "suite.csv:2:4: column 'dense_layers', value '4': every one of the 4 layers would be dense: no MoE layer "
            "is left");
  EXPECT_EQ(ErrorFor("name,experts,router\nx,4,softer\n").rfind(
                "suite.csv:2:3: column 'router', value 'softer': expected one of: softmax, sigmoid", 0),
            0u);
  EXPECT_EQ(ErrorFor("name,experts,aux_loss\nx,4,2\n"),
            "suite.csv:2:3: column 'aux_loss', value '2': at most 1: the balance loss is a small share of the objective");
  EXPECT_EQ(ErrorFor("name,experts,expert_bias\nx,4,1e-3\n"), "");
  EXPECT_EQ(ErrorFor("name,expert_bias\nx,1e-3\n"),
            "suite.csv:2:2: column 'expert_bias', value '0.001': the expert bias balances a mixture of experts: set "
            "experts");
  EXPECT_EQ(ErrorFor("name,experts,expert_bias\nx,4,2\n"),
            "suite.csv:2:3: column 'expert_bias', value '2': at most 1: a step moves each bias by γ");
  EXPECT_NE(ErrorFor("name,experts,expert_bias\nx,4,-1\n"), "");
  // PyTorch's pipelining and an external trainer are handed the experts (config.json's model.moe);
  // the framework adapters build dense models.
  EXPECT_EQ(ErrorFor("name,experts,trainer\nx,4,torch\n"), "");
  EXPECT_EQ(ErrorFor("name,experts,trainer\nx,4,megatron\n"),
            "suite.csv:2:2: column 'experts', value '4': trainer megatron is not given a mixture of experts: experts "
            "needs trainer pipecheck, torch or external:PATH");
}

TEST(ScenarioLoader, RejectsImpossibleCombinations) {
  EXPECT_EQ(ErrorFor("name,hidden,heads\nx,64,5\n"),
            "suite.csv:2:3: column 'heads', value '5': heads must divide hidden (64)");
  EXPECT_EQ(ErrorFor("name,hidden,heads\nx,12,4\n"),
            "suite.csv:2:3: column 'heads', value '4': llama's rotary embedding needs an even head dimension, "
            "but hidden 12 / heads 4 = 3");
  EXPECT_EQ(ErrorFor("name,flavor,hidden,heads\nx,gpt2,12,4\n"), "") << "gpt2 has no rotary embedding";
  EXPECT_EQ(ErrorFor("name,hidden\nx,30\n"),
            "suite.csv:2: column 'heads' (not in file, default '4'): heads must divide hidden (30)");
  EXPECT_EQ(ErrorFor("name,seq_len,seq_len_min\nx,16,20\n"),
            "suite.csv:2:3: column 'seq_len_min', value '20': seq_len_min must not exceed seq_len (16)");
  EXPECT_EQ(ErrorFor("name,batch,microbatches\nx,3,4\n"),
            "suite.csv:2:3: column 'microbatches', value '4': microbatches must not exceed batch (3): every "
            "microbatch needs a sequence");
  EXPECT_EQ(ErrorFor("name,layers,world_size,partition\nx,4,2,1;1;2\n"),
            "suite.csv:2:4: column 'partition', value '1;1;2': 3 counts given, but world_size 2 x virtual_stages "
            "1 = 2 stages");
  EXPECT_EQ(ErrorFor("name,layers,world_size,partition\nx,4,2,1;2\n"),
            "suite.csv:2:4: column 'partition', value '1;2': the counts add up to 3 layers, but the model has 4");
  EXPECT_NE(ErrorFor("name,virtual_stages\nx,2\n").find("suite.csv:2:2: column 'virtual_stages', value '2'"),
            std::string::npos);
  EXPECT_EQ(ErrorFor("name,batch,microbatches,data_parallel\nx,8,4,3\n"),
            "suite.csv:2:4: column 'data_parallel', value '3': data_parallel 3 x microbatches 4 = 12 microbatches, "
            "more than batch 8: every microbatch needs a sequence");
  EXPECT_EQ(ErrorFor("name,batch,microbatches,accumulation\nx,8,4,3\n"),
            "suite.csv:2:4: column 'accumulation', value '3': accumulation 3 x microbatches 4 = 12 microbatches, "
            "more than batch 8: every microbatch needs a sequence");
  EXPECT_EQ(ErrorFor("name,batch,microbatches,data_parallel,accumulation\nx,8,2,2,3\n"),
            "suite.csv:2:4: column 'data_parallel', value '2': data_parallel 2 x accumulation 3 x microbatches 2 = 12 "
            "microbatches, more than batch 8: every microbatch needs a sequence");
  EXPECT_EQ(ErrorFor("name,trainer,accumulation\nx,torch,2\n"),
            "suite.csv:2:3: column 'accumulation', value '2': trainer torch runs one round of its schedule per step: "
            "accumulation needs trainer=pipecheck or a framework (torchtitan, deepspeed, megatron)");
  EXPECT_EQ(ErrorFor("name,world_size,data_parallel\nx,200,2\n"),
            "suite.csv:2:3: column 'data_parallel', value '2': world_size 200 x data_parallel 2 = 400 processes, more "
            "than 256");
  EXPECT_EQ(ErrorFor("name,data_parallel\nx,0\n").rfind("suite.csv:2:2: column 'data_parallel', value '0'", 0), 0u);
  EXPECT_EQ(ErrorFor("name,trainer,data_parallel\nx,torch,2\n"),
            "suite.csv:2:3: column 'data_parallel', value '2': trainer torch is judged one pipeline at a time: "
            "data_parallel needs trainer=pipecheck or a framework (torchtitan, deepspeed, megatron)");
  EXPECT_EQ(ErrorFor("name,trainer,recompute\nx,torch,1\n"), "");  // activation checkpointing of each block
  EXPECT_EQ(ErrorFor("name,trainer,recompute\nx,external:t.py,1\n"),
            "suite.csv:2:3: column 'recompute', value '1': trainer external:t.py recomputes as it was written to: "
            "recompute needs trainer=pipecheck, torch (activation checkpointing of each block) or a framework "
            "(torchtitan, deepspeed, megatron)");
}

TEST(ScenarioLoader, TorchTitanRowsAskOnlyForWhatTorchTitanCanBeToldToDo) {
  const auto suite = ParseSuite(
      "name,trainer,dtype,batch,microbatches,data_parallel,accumulation,recompute,fault\n"
      "t,torchtitan,float32,8,2,2,2,1,plain_loss\n",
      "suite.csv");
  ASSERT_EQ(suite.size(), 1u);
  EXPECT_TRUE(suite[0].ExternalTrainer());
  EXPECT_EQ(suite[0].Processes(), 4) << "two replicas of a two-rank pipeline";
  EXPECT_EQ(suite[0].fault, "plain_loss") << "the adapter says itself which faults it knows";
  EXPECT_EQ(ErrorFor("name,trainer\nt,torchtitan\n"),
            "suite.csv:2: column 'dtype' (not in file, default 'float64'): trainer torchtitan trains in float32 or "
            "bfloat16 (TorchTitan's training.dtype has no float64)");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,flavor\nt,torchtitan,float32,gpt2\n"),
            "suite.csv:2:4: column 'flavor', value 'gpt2': trainer torchtitan trains TorchTitan's llama3: flavor must "
            "be llama");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,optimizer\nt,torchtitan,float32,sgd\n"),
            "suite.csv:2:4: column 'optimizer', value 'sgd': trainer torchtitan steps TorchTitan's own optimizers "
            "(Adam, AdamW, DistMuon): optimizer must be adamw");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,batch,microbatches\nt,torchtitan,float32,8,3\n"),
            "suite.csv:2:4: column 'batch', value '8': trainer torchtitan splits the batch into microbatches of one "
            "size: batch 8 must be a multiple of 3 (data_parallel x accumulation x microbatches)");
}

TEST(ScenarioLoader, DeepSpeedAndMegatronRowsAskOnlyForWhatTheFrameworksRun) {
  const auto suite = ParseSuite(
      "name,trainer,schedule,virtual_stages,dtype,batch,microbatches,data_parallel,loss\n"
      "d,deepspeed,1f1b,1,float32,16,4,2,microbatch_mean\n"
      "m,megatron,interleaved,2,float32,8,4,1,tokens\n",
      "suite.csv");
  ASSERT_EQ(suite.size(), 2u);
  EXPECT_EQ(suite[0].Processes(), 4);
  EXPECT_EQ(suite[0].loss, "microbatch_mean");
  EXPECT_EQ(ErrorFor("name,trainer,schedule\nd,deepspeed,gpipe\n"),
            "suite.csv:2:3: column 'schedule', value 'gpipe': trainer deepspeed runs its pipeline engine's one schedule "
            "(TrainSchedule, 1F1B): schedule must be 1f1b");
  EXPECT_EQ(ErrorFor("name,trainer\nm,megatron\n"),
            "suite.csv:2: column 'dtype' (not in file, default 'float64'): trainer megatron trains in float32 or "
            "bfloat16 (Megatron-Core has no float64 path)");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,schedule\nm,megatron,float32,zbv\n"),
            "suite.csv:2:4: column 'schedule', value 'zbv': trainer megatron runs Megatron-Core's schedules: 1f1b, or "
            "interleaved with virtual_stages > 1");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,flavor\nd,deepspeed,float32,gpt2\n"),
            "suite.csv:2:4: column 'flavor', value 'gpt2': trainer deepspeed's adapter builds the llama flavour: flavor "
            "must be llama");
  EXPECT_EQ(ErrorFor("name,trainer\nd,deepspeed\n"),
            "suite.csv:2: column 'dtype' (not in file, default 'float64'): trainer deepspeed trains in float32 or "
            "bfloat16 (its engine's gradient all-reduce refuses float64: split_half_float_double_sparse)");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,batch,microbatches,accumulation\nd,megatron,float32,8,2,2\n"),
            "suite.csv:2:6: column 'accumulation', value '2': trainer megatron accumulates over the microbatches of its "
            "one schedule run per step (its gradient accumulation steps): set microbatches instead");
  EXPECT_EQ(ErrorFor("name,trainer,dtype,batch,microbatches\nd,deepspeed,float32,8,3\n"),
            "suite.csv:2:4: column 'batch', value '8': trainer deepspeed splits the batch into microbatches of one "
            "size: batch 8 must be a multiple of 3 (data_parallel x accumulation x microbatches)");
}

TEST(ScenarioLoader, LossNormalisationIsAColumnThatKeepsTokenRowsFingerprints) {
  const auto tokens = ParseSuite("name,seq_len_min\nx,4\n", "suite.csv")[0];
  const auto mean = ParseSuite("name,seq_len_min,loss\nx,4,microbatch_mean\n", "suite.csv")[0];
  EXPECT_EQ(tokens.loss, "tokens");
  EXPECT_EQ(Configuration(tokens).find("loss="), std::string::npos);  // as before the column existed
  EXPECT_NE(Configuration(mean).find("loss=microbatch_mean"), std::string::npos);
  EXPECT_EQ(ErrorFor("name,loss\nx,mean\n"),
            "suite.csv:2:2: column 'loss', value 'mean': expected one of: tokens, microbatch_mean");
  EXPECT_EQ(ErrorFor("name,trainer,loss\nx,torch,microbatch_mean\n"),
            "suite.csv:2:3: column 'loss', value 'microbatch_mean': trainer torch normalises by the batch's tokens: "
            "loss microbatch_mean needs trainer pipecheck, deepspeed, megatron or external:PATH");
  EXPECT_EQ(ErrorFor("name,loss,fault\nx,microbatch_mean,mean_of_microbatch_means\n"),
            "suite.csv:2:3: column 'fault', value 'mean_of_microbatch_means': mean_of_microbatch_means is loss "
            "microbatch_mean's own rule, not a fault under it");
}

TEST(ScenarioLoader, DataParallelAndRecomputeKeepOnePipelinesFingerprint) {
  const auto one = ParseSuite("name,world_size\nx,2\n", "suite.csv")[0];
  const auto replicated = ParseSuite("name,world_size,data_parallel,recompute\nx,2,2,1\n", "suite.csv")[0];
  EXPECT_EQ(replicated.data_parallel, 2);
  EXPECT_TRUE(replicated.recompute);
  EXPECT_EQ(replicated.Processes(), 4);
  EXPECT_EQ(Configuration(one).find("data_parallel"), std::string::npos);  // rows of one pipeline: as before
  EXPECT_NE(Configuration(replicated).find("recompute=1 data_parallel=2"), std::string::npos);
  EXPECT_NE(Fingerprint(Configuration(one)), Fingerprint(Configuration(replicated)));
  const auto rounds = ParseSuite("name,world_size,batch,accumulation\nx,2,12,3\n", "suite.csv")[0];
  EXPECT_EQ(rounds.StepMicrobatches(), 3 * 4);
  EXPECT_EQ(Configuration(one).find("accumulation"), std::string::npos);
  EXPECT_NE(Configuration(rounds).find("accumulation=3"), std::string::npos);
}

// resume: each STEP[:COLUMN=VALUE;...] builds the next layout from the one before, held to a
// row's rules; only the layout may change, and the steps rise inside [1, steps).
TEST(ScenarioLoader, ResumeLayoutsAreBuiltInTurnAndHeldToEveryRule) {
  const auto row = ParseSuite("name,tied,steps,resume\nx,1,6,2:world_size=4|4:world_size=1;schedule=gpipe\n",
                              "suite.csv")[0];
  ASSERT_EQ(row.resumes.size(), 2u);
  EXPECT_EQ(row.resumes[0].step, 2);
  EXPECT_EQ(row.layouts[0].world_size, 4);
  EXPECT_EQ(row.layouts[0].schedule, "1f1b");  // unchanged columns carry over from the previous layout
  EXPECT_EQ(row.layouts[1].world_size, 1);
  EXPECT_EQ(row.layouts[1].schedule, "gpipe");
  EXPECT_EQ(row.world_size, 2);
  // A new schedule takes its own virtual_stages unless the resume gives them.
  const auto v = ParseSuite("name,steps,resume\nx,4,2:schedule=zbv\n", "suite.csv")[0];
  EXPECT_EQ(v.layouts[0].virtual_stages, 2);
  EXPECT_NE(Configuration(v).find("resume=2:schedule=zbv"), std::string::npos);
  EXPECT_EQ(Configuration(ParseSuite("name\nx\n", "suite.csv")[0]).find("resume"), std::string::npos);
  EXPECT_EQ(ParseSuite("name,steps,resume\nx,4,3\n", "suite.csv")[0].layouts[0].world_size, 2);  // same layout

  EXPECT_EQ(ErrorFor("name,steps,resume\nx,4,4\n"),
            "suite.csv:2:3: column 'resume', value '4': '4': a resume after step 4 must come after the previous one "
            "(0) and before the last step (4 steps)");
  EXPECT_EQ(ErrorFor("name,steps,resume\nx,6,3|2\n"),
            "suite.csv:2:3: column 'resume', value '3|2': '2': a resume after step 2 must come after the previous one "
            "(3) and before the last step (6 steps)");
  EXPECT_EQ(ErrorFor("name,steps,resume\nx,4,two\n").substr(0, 52), "suite.csv:2:3: column 'resume', value 'two': 'two': ");
  EXPECT_EQ(ErrorFor("name,steps,resume\nx,4,2:lr=1\n"),
            "suite.csv:2:3: column 'resume', value '2:lr=1': 'lr=1': a resume sets COLUMN=VALUE of the layout "
            "(world_size, schedule, virtual_stages, partition, data_parallel, recompute, accumulation); the model, "
            "data, optimizer and seed stay the row's");
  EXPECT_NE(ErrorFor("name,steps,resume\nx,4,2:world_size=0\n").find("'world_size=0': "), std::string::npos);
  // The layout after the resume breaks a rule a row would be held to: a V of three stages per rank.
  const std::string broken = ErrorFor("name,steps,resume\nx,4,2:schedule=zbv;virtual_stages=3\n");
  EXPECT_EQ(broken.rfind("suite.csv:2:3: column 'resume', value '2:schedule=zbv;virtual_stages=3': the layout after "
                         "step 2 breaks a rule: suite.csv:2: column 'virtual_stages'", 0), 0u) << broken;
  EXPECT_NE(ErrorFor("name,steps,resume\nx,4,2:partition=1;2\n"), "");  // 3 layers of 4
  const auto counts = ParseSuite("name,steps,resume\nx,4,2:partition=1;3;world_size=2\n", "suite.csv")[0];
  EXPECT_EQ(counts.layouts[0].partition, "1;3");
  EXPECT_EQ(counts.resumes[0].settings.size(), 2u);
  EXPECT_EQ(ErrorFor("name,trainer,dtype,steps,resume\nx,torch,float32,4,2\n"), "");
  // Another trainer resumes through the protocol (config.json's "resume"), at its own layout rules.
  EXPECT_EQ(ErrorFor("name,trainer,dtype,steps,resume\nx,deepspeed,float32,4,2\n"), "");
  EXPECT_NE(ErrorFor("name,trainer,dtype,steps,resume\nx,deepspeed,float32,4,2:schedule=zbv\n")
                .find("the layout after step 2 breaks a rule: "), std::string::npos);
}

TEST(ScenarioLoader, RejectsRowsWithTheWrongFieldCount) {
  EXPECT_EQ(ErrorFor("name,layers\nx,2\ny\n"), "suite.csv:3: too few fields: the header has 2 columns");
  EXPECT_EQ(ErrorFor("name,layers\nx,2,3\n"), "suite.csv:2: too many fields: the header has 2 columns");
  EXPECT_EQ(ErrorFor("name,layers\n\"x,2\n"), "suite.csv:2:1: a quoted field is not closed");
  EXPECT_EQ(ErrorFor("name,layers\n\"x\ny\",2\n"),
            "suite.csv:2:1: a quoted field spans lines; scenario values cannot contain line breaks (close the quote "
            "on the same line)");
}

// A CSV schedule is read relative to the suite file, validated (cells, then the simulator) at
// load time, and a broken one is exit 2's error naming the suite line and the CSV's row and cell.
TEST(ScenarioLoader, CsvSchedulesResolveAgainstTheSuiteAndAreValidatedAtLoad) {
  const std::string directory = testing::ScratchDirectory("csv_schedule");
  std::ofstream(directory + "/good.csv") << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  std::ofstream(directory + "/broken.csv") << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B7\n";
  std::ofstream(directory + "/suite.csv") << "name,schedule,batch,microbatches\ngood,csv:good.csv,4,2\n";
  const auto suite = harness::LoadSuite(directory + "/suite.csv");
  EXPECT_EQ(suite[0].schedule, "csv:" + directory + "/good.csv");
  std::ofstream(directory + "/suite.csv") << "name,schedule,batch,microbatches\nbroken,csv:broken.csv,4,2\n";
  try {
    harness::LoadSuite(directory + "/suite.csv");
    ADD_FAILURE() << "a broken CSV schedule loaded";
  } catch (const scenarios::ScenarioError& error) {
    EXPECT_EQ(std::string(error.what()),
              directory + "/suite.csv:2:2: column 'schedule', value 'csv:" + directory + "/broken.csv': " + directory +
                  "/broken.csv: row 2, cell 4: '1B7': microbatch 7 does not exist (the scenario has 2)");
  }
  std::ofstream(directory + "/suite.csv") << "name,schedule\nmissing,csv:nowhere.csv\n";
  EXPECT_THROW(harness::LoadSuite(directory + "/suite.csv"), scenarios::ScenarioError);
}

TEST(ScenarioLoader, NamesAnUnreadableFile) {
  try {
    harness::LoadSuite("/nonexistent/suite.csv");
    FAIL() << "expected an error";
  } catch (const ScenarioError& error) {
    EXPECT_EQ(std::string(error.what()), "/nonexistent/suite.csv: cannot open scenario file: No such file or directory");
  }
}

TEST(ScenarioLoader, SelectsByGlobAndFindsByName) {
  const auto suite = ParseSuite("name\nws1_a\nws2_b\nws1_c\n", "s.csv");
  EXPECT_EQ(scenarios::SelectScenarios(suite, "ws1_*").size(), 2u);
  EXPECT_EQ(scenarios::SelectScenarios(suite, "").size(), 3u);
  // A glob that matches nothing is a typo to report, not a quietly smaller run.
  try {
    scenarios::SelectScenarios(suite, "ws1_*,nothing*", "suite.csv");
    ADD_FAILURE() << "a glob matching nothing was ignored";
  } catch (const scenarios::ScenarioError& error) {
    EXPECT_STREQ(error.what(), "suite.csv: no scenario matches --only 'nothing*' (of 'ws1_*,nothing*')");
  }
  EXPECT_EQ(scenarios::FindScenario(suite, "ws2_b", "s.csv").source, "s.csv:3");
  EXPECT_THROW(scenarios::FindScenario(suite, "nope", "s.csv"), ScenarioError);
}

TEST(ScenarioLoader, CoreSuiteIsValid) {
  const auto suite = harness::LoadSuite(PIPECHECK_SOURCE_DIR "/scenarios/core.csv");
  EXPECT_GE(suite.size(), 10u);
}

// A suite saved by a spreadsheet starts with a UTF-8 byte-order mark: its first column is still
// `name`, not an unknown column with an invisible character in it.
TEST(ScenarioLoader, AByteOrderMarkIsReadPast) {
  const auto suite = harness::ParseSuite("\xEF\xBB\xBF" "name,layers\nx,2\n", "bom.csv");
  ASSERT_EQ(suite.size(), 1u);
  EXPECT_EQ(suite[0].name, "x");
  EXPECT_EQ(suite[0].layers, 2);
}

}  // namespace
// One table holds every per-dtype fact: the column accepts exactly its names, LibTorch's dtype
// agrees with its element size, and rows take their default tol from it.
TEST(Dtypes, TheTableIsWhatTheColumnAndLibTorchUse) {
  EXPECT_EQ(scenarios::DtypeNames(), (std::vector<std::string>{"float64", "float32", "bfloat16"}));
  for (const auto& traits : scenarios::Dtypes()) {
    EXPECT_EQ(torch::elementSize(harness::ParseDtype(traits.name)), static_cast<size_t>(traits.bytes)) << traits.name;
    EXPECT_LT(traits.default_tol, traits.max_tol) << traits.name;
    const auto rows = ParseSuite("name,dtype\nx," + traits.name + "\n", "t.csv");
    EXPECT_EQ(rows.at(0).tol, traits.default_tol) << traits.name;
  }
  EXPECT_TRUE(scenarios::DtypeOf("bfloat16").reduced);
  EXPECT_FALSE(scenarios::DtypeOf("float32").reduced);
  try {
    scenarios::DtypeOf("float16");
    FAIL() << "float16 has no traits";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'float16' (float64, float32, bfloat16)");
  }
}

// Every row a committed baseline holds has the configuration its suite gives it now, so a change to
// how configurations are written (or to a suite row) cannot turn a baseline's rows into CHANGED.
TEST(ScenarioLoader, CommittedBaselinesMatchTheirSuitesConfigurations) {
  std::map<std::string, std::string> configuration;
  for (const auto& entry : std::filesystem::directory_iterator(PIPECHECK_SOURCE_DIR "/scenarios")) {
    if (entry.path().extension() != ".csv") continue;
    for (const auto& scenario : harness::LoadSuite(entry.path().string())) {
      configuration[scenario.name] = Configuration(scenario);
    }
  }
  int rows = 0;
  for (const auto& entry : std::filesystem::directory_iterator(PIPECHECK_SOURCE_DIR "/reports/baselines")) {
    const auto summary = entry.path() / "summary.csv";
    if (!std::filesystem::exists(summary)) continue;
    std::ifstream stream(summary);
    const std::string text((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
    const auto table = reports::ParseCsv(text, summary.string());
    const auto& header = table.at(0);
    const auto column = [&](const std::string& name) {
      return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
    };
    // A baseline recorded before summaries carried configurations has none to check.
    if (column("config") == header.size()) continue;
    for (size_t i = 1; i < table.size(); ++i) {
      const std::string& scenario = table[i].at(column("scenario"));
      ++rows;
      ASSERT_TRUE(configuration.count(scenario)) << summary << ": " << scenario << " is in no suite";
      EXPECT_EQ(table[i].at(column("config")), configuration[scenario]) << summary << ": " << scenario;
      EXPECT_EQ(table[i].at(column("fingerprint")), Fingerprint(configuration[scenario])) << summary << ": " << scenario;
    }
  }
  EXPECT_GT(rows, 50);
}

// docs/scenarios.md's column table is the loader's own: names, defaults, values and meanings come
// from the one table the loader reads with (regenerate with `pipecheck validate --columns`).
TEST(ScenarioLoader, TheDocumentedColumnsAreTheLoadersTable) {
  std::ifstream stream(PIPECHECK_SOURCE_DIR "/docs/scenarios.md");
  const std::string doc((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  const std::string open = "<!-- columns: generated by `pipecheck validate --columns` -->\n";
  const auto begin = doc.find(open);
  const auto end = doc.find("<!-- /columns -->");
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const std::string documented = doc.substr(begin + open.size(), end - begin - open.size());
  const std::string table = scenarios::ColumnsMarkdown(harness::PipelineVocabulary());
  EXPECT_EQ(documented, table) << "docs/scenarios.md's table differs from `pipecheck validate --columns`";
  for (const auto& column : scenarios::ColumnNames()) {
    EXPECT_NE(table.find("| `" + column + "` |"), std::string::npos) << column;
  }
}

// The columns a summary repeats from its scenario are summary.csv columns of the same name, so
// none is dropped on the way (the summary's reader ignores names it does not know).
TEST(ScenarioLoader, EverySummaryValueIsASummaryColumn) {
  const auto suite = harness::LoadSuite(PIPECHECK_SOURCE_DIR "/scenarios/core.csv");
  const auto& columns = reports::SummaryColumns();
  const auto values = scenarios::SummaryValues(suite.at(0));
  EXPECT_EQ(values.size(), 13u);
  for (const auto& [name, value] : values) {
    EXPECT_NE(std::find(columns.begin(), columns.end(), name), columns.end()) << name;
  }
}

}  // namespace pipecheck
