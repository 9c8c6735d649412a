// Report CSV writing: RFC 4180 quoting read back by the fccp parser, and atomic replacement.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <libfccp/csv.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <fstream>
#include <cmath>
#include <map>
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
            "pp_tokens_per_s_runs,fingerprint,config,trainer,data_parallel,recompute,accumulation,pp_timed_steps,"
            "aux_loss_ref,aux_loss_pp,aux_loss_max_rel_err,routing_adopted");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::ParamColumns(), ",")),
            "scenario,param,stage,rank,numel,ref_norm,pp_norm,max_abs_diff,rel_err,ok,replica");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::StepColumns(), ",")), "scenario,step,loss_ref,loss_pp,abs_diff,layout");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::RankColumns(), ",")),
            "scenario,rank,stages,params,peak_bytes,busy_ms,idle_ms,comm_ms,peak_bytes_predicted,step_ms,"
            "step_ms_predicted,replica,forward_ms,backward_ms,input_grad_ms,weight_grad_ms,other_ms");
  EXPECT_EQ(fmt::format("{}", fmt::join(reports::TimelineColumns(), ",")),
            "scenario,rank,step,action,stage,microbatch,start_us,end_us,held_bytes,held_bytes_predicted,wait_start_us,"
            "step_start_us,peak_bytes,peak_bytes_predicted,layout");
}

TEST(Reports, AFailedScenarioKeepsEveryColumnAndSurvivesJson) {
  reports::ScenarioReport crashed;
  crashed.summary.scenario = "x";
  crashed.summary.status = reports::Status::kError;
  crashed.summary.message = "rank 1 was killed by signal 9, \"boom\"";
  const auto again = reports::FromJson(reports::ToJson(crashed));
  EXPECT_EQ(again.summary.status, reports::Status::kError);
  EXPECT_FALSE(again.summary.loss_pp.has_value());
  const auto directory = testing::ScratchDirectory("reports_failed");
  const auto paths = reports::WriteReports(directory, {again});
  ASSERT_EQ(paths.size(), 7u);  // summary, params, steps, ranks, timeline, boundaries, comm
  std::ifstream stream(paths[0]);
  std::stringstream text;
  text << stream.rdbuf();
  const auto rows = reports::ParseCsv(text.str(), paths[0]);
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_EQ(rows[0], reports::SummaryColumns());
  ASSERT_EQ(rows[1].size(), rows[0].size());
  std::map<std::string, std::string> cell;
  for (size_t i = 0; i < rows[0].size(); ++i) cell[rows[0][i]] = rows[1][i];
  EXPECT_EQ(cell["scenario"], "x");
  EXPECT_EQ(cell["status"], "ERROR");
  EXPECT_EQ(cell["ok"], "0");
  EXPECT_EQ(cell["message"], "rank 1 was killed by signal 9, \"boom\"");
  // What was never measured stays empty, not zero.
  for (const char* unmeasured : {"tokens", "loss_ref", "loss_pp", "grad_max_rel_err", "pp_tokens_per_s",
                                 "pp_peak_bytes_max", "bubble_measured", "wall_s", "pp_tokens_per_s_spread"}) {
    EXPECT_EQ(cell[unmeasured], "") << unmeasured;
  }
}

// Every summary field reads back what it wrote, through the CSV cells and through the JSON.
TEST(Reports, EverySummaryFieldRoundTrips) {
  reports::SummaryRow row;
  row.scenario = "s";
  row.status = reports::Status::kTimeout;
  row.ok = true;
  row.world_size = 4;
  row.tokens = 248;
  row.loss_pp = std::nan("");
  row.grad_max_rel_err = 3.861345427204147e-16;
  row.pp_peak_bytes_max = 6900296;
  row.pp_tokens_per_s_runs = 3;
  row.message = "a, \"quoted\" message";
  row.trainer = "external:bin/train.py";
  const auto cells = reports::Cells(reports::SummaryFields(), row);
  const auto back = reports::ParseCells(reports::SummaryFields(), reports::SummaryColumns(), cells);
  EXPECT_EQ(reports::Cells(reports::SummaryFields(), back), cells);
  EXPECT_EQ(back.status, reports::Status::kTimeout);
  EXPECT_EQ(back.world_size, 4);
  EXPECT_EQ(*back.tokens, 248);
  EXPECT_TRUE(std::isnan(*back.loss_pp));
  EXPECT_EQ(*back.grad_max_rel_err, 3.861345427204147e-16);  // the same double, not a rounded one
  EXPECT_EQ(*back.pp_peak_bytes_max, 6900296);
  EXPECT_FALSE(back.loss_ref.has_value());
  EXPECT_EQ(back.trainer, "external:bin/train.py");
  EXPECT_EQ(reports::ParseCells(reports::SummaryFields(), {"scenario"}, {"old"}).trainer, "pipecheck")
      << "a summary from before trainers were a column was pipecheck's own";
  reports::ScenarioReport report;
  report.summary = row;
  EXPECT_EQ(reports::Cells(reports::SummaryFields(), reports::FromJson(reports::ToJson(report)).summary), cells);
  EXPECT_THROW(reports::ParseStatus("PASSED"), reports::FieldError);
  EXPECT_THROW(reports::ParseCells(reports::SummaryFields(), {"tokens"}, {"12x"}), reports::FieldError);
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
