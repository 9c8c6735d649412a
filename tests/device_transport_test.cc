// Devices and transports. Tests whose names end in _CUDA need a CUDA device: without one they
// skip (GTEST_SKIP, reported as skipped by CTest) and check nothing; with one they run in full,
// the same checks on any GPU machine. The rest run everywhere and check the same everywhere.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cmath>
#include <cstdlib>
#include <thread>

#include "harness/launcher.h"
#include "harness/runnable.h"
#include "harness/scenario_model.h"
#include "pipeline/trainer.h"
#include "pipeline/transport.h"
#include "pipeline/transport_parts.h"
#include "reference/device.h"
#include "reference/trainer.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

const char* const kGpuSuite = PIPECHECK_SOURCE_DIR "/scenarios/gpu.csv";

#define SKIP_WITHOUT_CUDA()                                                                              \
  do {                                                                                                   \
    if (reference::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this build or machine";   \
  } while (0)

// Sets an environment variable for one test and restores it afterwards.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnvironment() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

scenarios::Scenario CudaScenario(int64_t world_size, const std::string& transport) {
  auto scenario = harness::ParseSuite("name,world_size,device,transport\nx," + std::to_string(world_size) + ",cuda," +
                                          transport + "\n",
                                      "inline")[0];
  return scenario;
}

// --- the discipline, on two Gloo ranks (threads) over one in-memory store -----------------------

struct GlooPair {
  std::unique_ptr<pipeline::Transport> ranks[2];
};

GlooPair ConnectPair() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  GlooPair pair;
  std::thread other([&] {
    pipeline::RendezvousOptions options;
    options.rank = 1;
    options.world_size = 2;
    pair.ranks[1] = pipeline::MakeGlooTransport(store, pipeline::MakeGloo(store, options), options, false);
  });
  pipeline::RendezvousOptions options;
  options.world_size = 2;
  pair.ranks[0] = pipeline::MakeGlooTransport(store, pipeline::MakeGloo(store, options), options, false);
  other.join();
  return pair;
}

TEST(TransportDiscipline, MessagesAreMatchedByOrderAndTheHeaderNamesThem) {
  auto pair = ConnectPair();
  const auto a = torch::arange(6, torch::kFloat64).reshape({2, 3}), b = -a;
  const int tag_a = pipeline::MessageTag(pipeline::Direction::kActivation, 1, 0);
  const int tag_b = pipeline::MessageTag(pipeline::Direction::kActivation, 1, 1);
  const pipeline::MessageShape shape{torch::kFloat64, {2, 3}};
  auto send_a = pair.ranks[1]->Send(a, 0, tag_a, std::nullopt);
  auto send_b = pair.ranks[1]->Send(b, 0, tag_b, std::nullopt);
  // Received in the order sent: each message is the one its receive names.
  auto got_a = pair.ranks[0]->Recv(1, tag_a, torch::kCPU, shape);
  auto got_b = pair.ranks[0]->Recv(1, tag_b, torch::kCPU, shape);
  EXPECT_TRUE(torch::equal(got_a->Wait(), a));
  EXPECT_TRUE(torch::equal(got_b->Wait(), b));
  send_a->Wait();
  send_b->Wait();
  // Posted in the other order: NCCL would hand over the wrong tensor; here the header says so.
  send_a = pair.ranks[1]->Send(a, 0, tag_a, std::nullopt);
  send_b = pair.ranks[1]->Send(b, 0, tag_b, std::nullopt);
  auto wrong_b = pair.ranks[0]->Recv(1, tag_b, torch::kCPU, shape);
  auto wrong_a = pair.ranks[0]->Recv(1, tag_a, torch::kCPU, shape);
  try {
    wrong_b->Wait();
    FAIL() << "a message taken out of order was accepted";
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    EXPECT_NE(message.find("is the activation for stage 1, microbatch 0 but this receive is for the activation for "
                           "stage 1, microbatch 1"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("matched by order"), std::string::npos) << message;
  }
  EXPECT_THROW(wrong_a->Wait(), c10::Error);
  send_a->Wait();
  send_b->Wait();
}

// A pipeline message goes as one buffer, received into the planned shape: a shorter one lands
// and its header says what it is; a receive with no plan for it is refused. A plain tensor is
// copied in at Send, so overwriting it then changes nothing; a SendBuffer tensor goes in place,
// so what it holds when the message leaves (not before the receiver has posted: Gloo's ready
// notice) is what arrives. A tensor laid out as a SendBuffer one but made elsewhere is copied.
TEST(TransportDiscipline, APipelineMessageTravelsWholeIntoItsPlannedShape) {
  auto pair = ConnectPair();
  const int tag = pipeline::MessageTag(pipeline::Direction::kGradient, 0, 2);
  const pipeline::MessageShape planned{torch::kFloat32, {2, 3}};
  auto short_send = pair.ranks[1]->Send(torch::ones({2, 2}), 0, tag, std::nullopt);
  try {
    pair.ranks[0]->Recv(1, tag, torch::kCPU, planned)->Wait();
    FAIL() << "a message shorter than planned was accepted";
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    EXPECT_NE(message.find("is float32 (2, 2) but the plan expects float32 (2, 3)"), std::string::npos) << message;
  }
  short_send->Wait();
  EXPECT_THROW(pair.ranks[0]->Recv(1, tag, torch::kCPU, std::nullopt), c10::Error);

  auto plain = torch::arange(6, torch::kFloat32).reshape({2, 3});
  const auto expected = plain.clone();
  auto copied = pair.ranks[1]->Send(plain, 0, tag, std::nullopt);
  plain.zero_();
  EXPECT_TRUE(torch::equal(pair.ranks[0]->Recv(1, tag, torch::kCPU, planned)->Wait(), expected));
  copied->Wait();

  auto buffer = pair.ranks[1]->SendBuffer(plain);
  buffer.copy_(expected);
  auto in_place = pair.ranks[1]->Send(buffer, 0, tag, std::nullopt);
  buffer.fill_(7.0f);
  EXPECT_TRUE(torch::equal(pair.ranks[0]->Recv(1, tag, torch::kCPU, planned)->Wait(), torch::full({2, 3}, 7.0f)));
  in_place->Wait();

  // A look-alike: a view that starts a header's bytes into a storage of its own and ends with it
  // has SendBuffer's layout, but the transport did not make it, so it is copied and the bytes
  // before it (someone else's) stay as they were.
  const int64_t header_floats = pipeline::kMessageHeaderBytes / 4;
  auto storage = torch::full({header_floats + 6}, -1.0f);
  auto look_alike = storage.narrow(0, header_floats, 6).view({2, 3});
  look_alike.copy_(expected);
  auto copied_again = pair.ranks[1]->Send(look_alike, 0, tag, std::nullopt);
  look_alike.zero_();
  EXPECT_TRUE(torch::equal(pair.ranks[0]->Recv(1, tag, torch::kCPU, planned)->Wait(), expected));
  copied_again->Wait();
  EXPECT_TRUE(torch::equal(storage.narrow(0, 0, header_floats), torch::full({header_floats}, -1.0f)));
}

// The pairs that carry messages, from the schedule's sends and the tied sum: 1F1B on 3 ranks
// talks to neighbours both ways; interleaved wraps from the last rank to the first; a tied
// embedding adds the exchange between the first and last stage's ranks.
TEST(NcclChannels, EveryPairThatCarriesAMessageAndNoOther) {
  using Pairs = std::vector<std::pair<int, int>>;
  pipeline::PipelineConfig config;
  config.world_size = 3;
  config.microbatches = 4;
  config.schedule = "1f1b";
  EXPECT_EQ(pipeline::MessageChannels(config, pipeline::BuildSchedule(config)), (Pairs{{0, 1}, {1, 0}, {1, 2}, {2, 1}}));
  config.schedule = "interleaved";
  config.virtual_stages = 2;
  config.microbatches = 6;
  EXPECT_EQ(pipeline::MessageChannels(config, pipeline::BuildSchedule(config)),
            (Pairs{{0, 1}, {0, 2}, {1, 0}, {1, 2}, {2, 0}, {2, 1}}));
  config.schedule = "1f1b";
  config.virtual_stages = 1;
  config.world_size = 4;
  config.train.model.tied = true;
  EXPECT_EQ(pipeline::MessageChannels(config, pipeline::BuildSchedule(config)),
            (Pairs{{0, 1}, {0, 3}, {1, 0}, {1, 2}, {2, 1}, {2, 3}, {3, 0}, {3, 2}}));
  config.world_size = 1;
  EXPECT_EQ(pipeline::MessageChannels(config, pipeline::BuildSchedule(config)), Pairs{});
}

// Each rank sets up its channels in one global order: any two ranks list the channels they share
// in the same order, so the first one not yet set up has both its ends at it.
TEST(NcclChannels, EachRankSetsUpItsShareInOneGlobalOrder) {
  using Pairs = std::vector<std::pair<int, int>>;
  const Pairs given = {{2, 0}, {0, 1}, {1, 2}, {0, 1}, {2, 1}, {1, 0}, {0, 2}};
  EXPECT_EQ(pipeline::ChannelsOfRank(given, 0, 3), (Pairs{{0, 1}, {0, 2}, {1, 0}, {2, 0}}));
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      if (a == b) continue;
      Pairs shared_a, shared_b;
      for (const auto& pair : pipeline::ChannelsOfRank(given, a, 3)) {
        if (pair.first == b || pair.second == b) shared_a.push_back(pair);
      }
      for (const auto& pair : pipeline::ChannelsOfRank(given, b, 3)) {
        if (pair.first == a || pair.second == a) shared_b.push_back(pair);
      }
      EXPECT_EQ(shared_a, shared_b) << a << " " << b;
    }
  }
  EXPECT_THROW(pipeline::ChannelsOfRank({{1, 1}}, 0, 3), c10::Error);
  EXPECT_THROW(pipeline::ChannelsOfRank({{0, 3}}, 0, 3), c10::Error);
}

// nccl validates every schedule on its channels' streams (simulator.h: kDeviceStreams):
// interleaved and ZB-V load for nccl; cpu stays on the host model.
TEST(TransportChoice, NcclChecksSchedulesOnItsDeviceStreams) {
  const std::string header = "name,world_size,device,transport,schedule,virtual_stages,microbatches\n";
  EXPECT_NO_THROW(harness::ParseSuite(header + "x,4,cuda,nccl,interleaved,2,8\n", "inline.csv"));
  EXPECT_NO_THROW(harness::ParseSuite(header + "x,2,cuda,nccl,zbv,,4\n", "inline.csv"));
  EXPECT_NO_THROW(harness::ParseSuite(header + "x,2,cuda,staged,interleaved,2,4\n", "inline.csv"));
  const auto config = harness::ToPipelineConfig(harness::ParseSuite(header + "x,2,cpu,auto,1f1b,1,4\n", "inline")[0]);
  EXPECT_EQ(config.communication, pipeline::CommunicationModel::kHost);
}
TEST(TransportChoice, CpuIsGlooAndNcclNeedsAGpuPerRank) {
  const auto cpu = harness::ParseSuite("name,world_size\nx,2\n", "inline")[0];
  EXPECT_EQ(harness::ResolveTransport(cpu), "gloo");
  EXPECT_EQ(harness::UnmetRequirement(cpu), "");
  EXPECT_EQ(harness::ResolveTransport(CudaScenario(1, "auto")), "none");
  // More ranks on this host than it has GPUs (whatever it has): nccl cannot run, staged can.
  const ScopedEnvironment local("LOCAL_WORLD_SIZE", std::to_string(reference::CudaDeviceCount() + 1));
  EXPECT_EQ(harness::ResolveTransport(CudaScenario(2, "auto")), "staged");
  EXPECT_EQ(harness::UnmetRequirement(CudaScenario(2, "staged")), "");
  const std::string unmet = harness::UnmetRequirement(CudaScenario(2, "nccl"));
  EXPECT_NE(unmet.find("transport nccl needs a GPU per rank"), std::string::npos) << unmet;
  pipeline::RendezvousOptions two_ranks;
  two_ranks.world_size = 2;
  EXPECT_THROW(pipeline::Connect(two_ranks, "gloo", torch::Device(torch::kCUDA, 0)), c10::Error);
  EXPECT_THROW(pipeline::Connect(two_ranks, "staged", torch::kCPU), c10::Error);
}

// --- on a GPU -----------------------------------------------------------------------------------

TEST(Device, RanksTakeCudaLocalRank_CUDA) {
  SKIP_WITHOUT_CUDA();
  const int count = reference::CudaDeviceCount();
  {
    const ScopedEnvironment local("LOCAL_RANK", "0");
    EXPECT_EQ(harness::CudaDeviceOfThisRank(), torch::Device(torch::kCUDA, 0));
  }
  {
    const ScopedEnvironment local("LOCAL_RANK", std::to_string(count + 1));  // shares: cuda:(count + 1) % count
    EXPECT_EQ(harness::CudaDeviceOfThisRank(), torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(1 % count)));
  }
}

TEST(Device, AutoPicksNcclWhenEveryRankHasItsGpu_CUDA) {
  SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(pipeline::NcclAvailable()) << "a CUDA build without the nccl transport";
  const ScopedEnvironment local("LOCAL_WORLD_SIZE", "1");  // one rank of the two on this host
  EXPECT_EQ(harness::ResolveTransport(CudaScenario(2, "auto")), "nccl");
  EXPECT_EQ(harness::UnmetRequirement(CudaScenario(2, "nccl")), "");
}

reference::TrainConfig SmallCudaConfig() {
  auto config = testing::TinyConfig(reference::Flavor::kLlama, /*tied=*/false);
  config.model.hidden = 64;
  config.model.heads = 4;
  config.data.seq_len_min = 0;  // every step the same shapes: the same peak
  config.dtype = torch::kFloat32;
  config.device = torch::Device(torch::kCUDA, 0);
  config.steps = 3;
  return config;
}

TEST(Device, PeakMemoryIsTheCachingAllocatorsAndReproducible_CUDA) {
  SKIP_WITHOUT_CUDA();
  reference::WarmUpDevice(torch::Device(torch::kCUDA, 0));  // as workers do: cuBLAS's workspaces exist first
  std::vector<int64_t> peaks[2];
  for (auto& run : peaks) {
    reference::ReferenceTrainer trainer(SmallCudaConfig());
    for (int64_t step = 0; step < 3; ++step) run.push_back(trainer.Step(step).peak_bytes);
  }
  int64_t parameter_bytes = 0;
  {
    reference::ReferenceTrainer trainer(SmallCudaConfig());
    for (const auto& p : trainer.model()->parameters()) parameter_bytes += p.numel() * p.element_size();
  }
  EXPECT_GT(peaks[0][1], parameter_bytes);  // gradients at least, activations and optimizer state too
  EXPECT_EQ(peaks[0][1], peaks[0][2]);       // the same step twice: the same peak
  EXPECT_EQ(peaks[0], peaks[1]);             // and the same again in a fresh trainer
}

TEST(Device, ClockMarksAreOrderedOnTheDevice_CUDA) {
  SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  reference::DeviceClock clock(device);
  const int start = clock.Mark();
  auto x = torch::randn({2048, 2048}, torch::TensorOptions().device(device));
  for (int i = 0; i < 8; ++i) x = torch::mm(x, x).tanh_();
  const int end = clock.Mark();
  EXPECT_EQ(clock.Microseconds(start), 0.0);
  EXPECT_GT(clock.Microseconds(end), 0.0);  // the products' time on the GPU, read without a sync per mark
}

// HostSyncCheck catches a wait (else the next test could pass by checking nothing), ToDevice
// does not wait, and keeps every value of a strided tensor.
TEST(Device, HostSyncCheckCatchesWaitsAndToDeviceDoesNotWait_CUDA) {
  SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  const auto on_gpu = torch::ones({4}, torch::TensorOptions().device(device));
  const auto strided = torch::arange(12, torch::kInt64).view({3, 4}).narrow(1, 1, 2);  // (3, 2) of a (3, 4)
  torch::Tensor moved;
  {
    const reference::HostSyncCheck check(/*active=*/true, device);
    EXPECT_THROW((void)on_gpu.sum().item<float>(), c10::Error);  // reads the device
    EXPECT_THROW((void)torch::ones({4}).to(device), c10::Error);  // a blocking copy from pageable memory
    EXPECT_NO_THROW(moved = reference::ToDevice(strided, device));
  }
  EXPECT_EQ(on_gpu.sum().item<float>(), 4.0F);  // the check ended with its scope
  EXPECT_EQ(moved.device(), device);
  EXPECT_TRUE(torch::equal(moved.cpu(), strided));
}

// World size 1 with 8 microbatches in `schedule` (interleaved: two stages on the one rank,
// handing over through fingerprints, tied), two steps on `device`: the losses.
std::vector<double> WorldSizeOneLosses(torch::Device device, torch::Dtype dtype, const std::string& schedule,
                                       bool check_host_syncs) {
  pipeline::PipelineConfig config;
  config.train = SmallCudaConfig();
  config.train.device = device;
  config.train.dtype = dtype;
  config.train.data.batch = 8;
  config.train.model.tied = schedule == "interleaved";
  config.train.check_host_syncs = check_host_syncs;
  config.microbatches = 8;
  config.schedule = schedule;
  config.virtual_stages = schedule == "interleaved" ? 2 : 1;
  auto transport = pipeline::Connect(pipeline::RendezvousOptions{}, "gloo", device);  // world size 1: no peers
  pipeline::PipelineTrainer trainer(config, *transport);
  pipeline::RankResult result;
  for (int64_t step = 0; step < 2; ++step) trainer.Step(step, result);
  return result.losses;
}

// The reference accumulating over the same 8 microbatches, one step on `device`: its loss.
double MicrobatchedReferenceLoss(torch::Device device, torch::Dtype dtype, bool check_host_syncs) {
  auto train = SmallCudaConfig();
  train.device = device;
  train.dtype = dtype;
  train.data.batch = 8;
  train.microbatches = 8;
  train.check_host_syncs = check_host_syncs;
  reference::ReferenceTrainer reference(train);
  return reference.Step(0).loss;
}

// A GPU step's forwards and backwards only queue work: the host never waits for the device
// inside them, so it runs ahead of the GPU across microbatches (a wait per microbatch made world
// size 1 with 8 microbatches 2.7x its reference in bf16 on an H100). World size 1 in 1F1B and
// interleaved, and the reference accumulating over the same 8 microbatches, in fp32 and bf16.
TEST(Device, StepsQueueOnTheGpuWithoutHostWaits_CUDA) {
  SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  reference::WarmUpDevice(device);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const std::string schedule : {"1f1b", "interleaved"}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + schedule);
      try {
        const auto losses = WorldSizeOneLosses(device, dtype, schedule, /*check_host_syncs=*/true);
        ASSERT_EQ(losses.size(), 2U);
        for (double loss : losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
      } catch (const c10::Error& error) {
        FAIL() << error.what_without_backtrace();
      }
    }
    try {
      EXPECT_TRUE(std::isfinite(MicrobatchedReferenceLoss(device, dtype, /*check_host_syncs=*/true)));
    } catch (const c10::Error& error) {
      FAIL() << "reference, " << c10::toString(dtype) << ": " << error.what_without_backtrace();
    }
  }
}

// The check only watches: on the CPU (where it is inert) the same runs give the same losses,
// bitwise, with it as without it. (Also runs the GPU test's set-up everywhere.)
TEST(Device, HostSyncCheckChangesNoResult) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const std::string schedule : {"1f1b", "interleaved"}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + schedule);
      const auto checked = WorldSizeOneLosses(torch::kCPU, dtype, schedule, true);
      EXPECT_EQ(checked, WorldSizeOneLosses(torch::kCPU, dtype, schedule, false));
      ASSERT_EQ(checked.size(), 2U);
      EXPECT_TRUE(std::isfinite(checked[1])) << checked[1];
    }
    EXPECT_EQ(MicrobatchedReferenceLoss(torch::kCPU, dtype, true), MicrobatchedReferenceLoss(torch::kCPU, dtype, false));
  }
}

TEST(Nccl, CollectivesAtWorldSizeOneAndChannelsOnlyBetweenPairsOfRanks_CUDA) {
  SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(pipeline::NcclAvailable()) << "a CUDA build without the nccl transport";
  const torch::Device device(torch::kCUDA, 0);
  pipeline::RendezvousOptions options;  // rank 0 of 1
  auto transport = pipeline::MakeNcclTransport(c10::make_intrusive<c10d::HashStore>(), options, device);
  EXPECT_EQ(transport->name(), "nccl");
  EXPECT_EQ(transport->AllGather(2.5), std::vector<double>{2.5});
  transport->Barrier();
  transport->OpenChannels({});  // nothing to carry: nothing made
  // A channel joins two ranks; a message on a pair never opened is an error naming it.
  EXPECT_THROW(transport->OpenChannels({{0, 0}}), c10::Error);
  const auto a = torch::randn({4, 8}, torch::TensorOptions().device(device));
  const int tag = pipeline::MessageTag(pipeline::Direction::kGradient, 0, 3);
  try {
    transport->Send(a, 0, tag, std::nullopt);
    FAIL() << "a message on a pair without a channel was sent";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what_without_backtrace()).find("a pair OpenChannels was not given"), std::string::npos)
        << error.what_without_backtrace();
  }
}

// Every row of scenarios/gpu.csv but the throughput rows (those `pipecheck run` times), as real
// ranks against the reference: PASS with the transport its row asks for, or SKIPPED with the
// reason where this host has too few GPUs for nccl.
std::vector<std::string> GpuRows() {
  std::vector<std::string> names;
  for (const auto& scenario : harness::LoadSuite(kGpuSuite)) {
    if (scenario.name.rfind("gpu_throughput", 0) != 0) names.push_back(scenario.name);
  }
  return names;
}

class GpuSuite : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuSuite, MatchesReference) {
  SKIP_WITHOUT_CUDA();
  const auto suite = harness::LoadSuite(kGpuSuite);
  const scenarios::Scenario scenario = scenarios::FindScenario(suite, GetParam(), kGpuSuite);
  const std::string unmet = harness::UnmetRequirement(scenario);
  if (!unmet.empty()) {
    EXPECT_EQ(scenario.transport, "nccl");
    EXPECT_GT(scenario.world_size, reference::CudaDeviceCount()) << unmet;
    GTEST_SKIP() << unmet;
  }
  const auto report =
      harness::LaunchScenario(scenario, testing::TestLaunchOptions("gpu_" + scenario.name, 300));
  EXPECT_EQ(report.summary.status, reports::Status::kPass) << report.summary.message;
  EXPECT_EQ(report.summary.transport, scenario.world_size == 1 ? "none" : scenario.transport);
  EXPECT_EQ(report.summary.device, "cuda");
  EXPECT_GT(report.summary.pp_peak_bytes_max.value_or(0), 0);
  EXPECT_EQ(report.steps.size(), static_cast<size_t>(scenario.steps));
}

INSTANTIATE_TEST_SUITE_P(Rows, GpuSuite, ::testing::ValuesIn(GpuRows()),
                         [](const auto& info) { return info.param + "_CUDA"; });

}  // namespace
}  // namespace pipecheck
