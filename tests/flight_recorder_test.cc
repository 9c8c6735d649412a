// The flight recorder: what a rank was doing survives it, and reads back as the launcher tells it.
#include <gtest/gtest.h>

#include <fstream>

#include "pipeline/flight_recorder.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

TEST(FlightRecorder, TheLastEntryTellsWhatARankWasDoing) {
  const std::string path = testing::ScratchDirectory("flight") + "/rank1.flight";
  {
    pipeline::FlightRecorder recorder(path);
    recorder.Started(0, "1F0", 0, 10.0);
    recorder.Ended(25.5);
    recorder.Started(1, "1RECV_B2", 2, 40.0);
  }  // closed as a killed rank's file would be: the last action never ended
  const auto entries = pipeline::ReadFlightRecord(path);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].what, "1F0");
  EXPECT_EQ(entries[0].end_us, 25.5);
  EXPECT_FALSE(entries[1].end_us.has_value());
  EXPECT_EQ(pipeline::DescribeLastEntry(entries), "blocked in 1RECV_B2 from rank 2 (step 1)");

  std::ofstream(path, std::ios::app) << "E 41.0\nS 1 1F3 0 5";  // a line cut short by the kill
  const auto after = pipeline::ReadFlightRecord(path);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(pipeline::DescribeLastEntry(after), "last finished 1RECV_B2 from rank 2 (step 1); nothing started since");

  pipeline::FlightRecorder computing(path);
  computing.Started(1, "0B1", 1, 3.0);
  EXPECT_EQ(pipeline::DescribeLastEntry(pipeline::ReadFlightRecord(path)),
            "blocked in 0B1 (step 1): awaiting its input from rank 1, or computing");
  // Where the launcher saw whether the rank used CPU time, it says which of the two it was.
  EXPECT_EQ(pipeline::DescribeLastEntry(pipeline::ReadFlightRecord(path), true), "computing 0B1 (step 1)");
  EXPECT_EQ(pipeline::DescribeLastEntry(pipeline::ReadFlightRecord(path), false),
            "waiting in 0B1 (step 1) for its input from rank 1");
  EXPECT_EQ(pipeline::DescribeLastEntry(entries, false), "waiting in 1RECV_B2 from rank 2 (step 1)");
  EXPECT_EQ(pipeline::DescribeLastEntry(after, true),
            "last finished 1RECV_B2 from rank 2 (step 1); nothing started since, computing");
  EXPECT_EQ(pipeline::DescribeLastEntry({}), "recorded nothing (it had not reached its first action)");
  EXPECT_TRUE(pipeline::ReadFlightRecord(path + ".missing").empty());
}

}  // namespace
}  // namespace pipecheck
