// Report CSV writing: RFC 4180 quoting read back by the fccp parser, and atomic replacement.
#include <gtest/gtest.h>
#include <libfccp/csv.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "reports/csv.h"
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

}  // namespace
}  // namespace pipecheck
