// Report CSV writing: RFC 4180 quoting read back by the fccp parser, and atomic replacement.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <libfccp/csv.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <fstream>
#include <sstream>

#include "reports/csv.h"
#include "reports/report.h"
#include "tests/test_support.h"

namespace pipecheck {
namespace {

TEST(Csv, QuotesOnlyWhatNeedsQuoting) {
  EXPECT_EQ(reports::CsvField("plain"), "plain");
  EXPECT_EQ(reports::CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(reports::CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(reports::CsvLine({"x", "", "1;2"}), "x,,1;2\n");
}

TEST(Csv, QuotedFieldsRoundTripThroughTheParser) {
  reports::CsvTable table({"scenario", "message"});
  table.AddRow({"a", "grad of layers.0.wq, step 1: \"too far\""});
  table.AddRow({"b", ""});
  const std::string text = table.ToString();
  io::CSVReader<2, io::trim_chars<>, io::double_quote_escape<',', '"'>> reader("t.csv", text.data(),
                                                                                text.data() + text.size());
  reader.read_header(io::ignore_no_column, "scenario", "message");
  std::string scenario, message;
  ASSERT_TRUE(reader.read_row(scenario, message));
  EXPECT_EQ(scenario, "a");
  EXPECT_EQ(message, "grad of layers.0.wq, step 1: \"too far\"");
  ASSERT_TRUE(reader.read_row(scenario, message));
  EXPECT_EQ(message, "");
  EXPECT_THROW(table.AddRow({"only one"}), std::logic_error);
}

TEST(Csv, AtomicWriteReplacesAndLeavesNoTemporary) {
  const auto directory = testing::ScratchDirectory("csv_atomic");
  const auto path = directory + "/summary.csv";
  reports::WriteFileAtomically(path, "old\n");
  reports::WriteFileAtomically(path, "new\n");
  std::ifstream stream(path);
  std::stringstream contents;
  contents << stream.rdbuf();
  EXPECT_EQ(contents.str(), "new\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(directory), std::filesystem::directory_iterator()), 1);
  EXPECT_THROW(reports::WriteFileAtomically(directory + "/missing/summary.csv", "x"), std::runtime_error);
}

TEST(Reports, ColumnsAreExactlyTheDesigns) {
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::SummaryColumns(), ",")),
            "scenario,status,expect,ok,world_size,schedule,virtual_stages,microbatches,dtype,device,steps,tokens,"
            "loss_ref,loss_pp,loss_max_abs_diff,grad_max_rel_err,worst_param,params_checked,weights_max_rel_err,"
            "ref_step_ms,pp_step_ms,ref_tokens_per_s,pp_tokens_per_s,ref_peak_bytes,pp_peak_bytes_max,bubble_theory,"
            "bubble_measured,message,transport,pp_peak_bytes_predicted,pp_step_ms_predicted,wall_s,pp_tokens_per_s_spread,"
            "pp_tokens_per_s_runs,fingerprint,config");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::ParamColumns(), ",")),
            "scenario,param,stage,rank,numel,ref_norm,pp_norm,max_abs_diff,rel_err,ok");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::StepColumns(), ",")), "scenario,step,loss_ref,loss_pp,abs_diff");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::RankColumns(), ",")),
            "scenario,rank,stages,params,peak_bytes,busy_ms,idle_ms,comm_ms,peak_bytes_predicted,step_ms,"
            "step_ms_predicted");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::TimelineColumns(), ",")),
            "scenario,rank,step,action,stage,microbatch,start_us,end_us,held_bytes,held_bytes_predicted,wait_start_us,"
            "step_start_us,peak_bytes,peak_bytes_predicted");
}

TEST(Reports, AFailedScenarioKeepsEveryColumnAndSurvivesJson) {
  reports::ScenarioReport crashed;
  crashed.summary = {{"scenario", "x"}, {"status", "ERROR"}, {"message", "rank 1 was killed by signal 9, \"boom\""}};
  const auto again = reports::FromJson(reports::ToJson(crashed));
  const auto directory = testing::ScratchDirectory("reports_failed");
  const auto paths = reports::WriteReports(directory, {again});
  ASSERT_EQ(paths.size(), 7u);  // summary, params, steps, ranks, timeline, boundaries, comm
  std::ifstream stream(paths[0]);
  std::string header, row;
  std::getline(stream, header);
  std::getline(stream, row);
  EXPECT_EQ(row, "x,ERROR" + std::string(26, ',') + "\"rank 1 was killed by signal 9, \"\"boom\"\"\",,,,,,,,");
}

TEST(Csv, AWriterKilledMidwayLeavesThePreviousFileWhole) {
  const auto directory = testing::ScratchDirectory("csv_killed");
  const auto path = directory + "/summary.csv";
  const std::string previous = "scenario,status\nold,PASS\n";
  const std::string next(64 << 20, 'x');  // large enough to be caught mid-write
  int killed_mid_write = 0;  // kills that provably landed while the new contents were being written
  for (int delay_ms : {0, 2, 5, 10, 20, 40}) {
    reports::WriteFileAtomically(path, previous);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      reports::WriteFileAtomically(path, next);
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    // The writer's temporary, left partly written, shows the kill interrupted the write itself.
    const std::string temporary = path + ".tmp." + std::to_string(child);
    std::error_code error;
    const auto partial = std::filesystem::file_size(temporary, error);
    if (!error && partial < next.size()) ++killed_mid_write;
    std::filesystem::remove(temporary, error);
    std::ifstream stream(path, std::ios::binary);
    std::stringstream contents;
    contents << stream.rdbuf();
    const std::string seen = contents.str();
    EXPECT_TRUE(seen == previous || seen == next) << "after " << delay_ms << " ms: a file of " << seen.size()
                                                  << " bytes that is neither version";
  }
  EXPECT_GT(killed_mid_write, 0) << "no kill landed during a write: the test proved nothing";
}

}  // namespace
}  // namespace pipecheck
