// CSV output shared by every report: RFC 4180 quoting, one header, and files that are
// replaced atomically (written to a temporary file, then renamed), so a reader never sees
// half a report; and the reverse of CsvLine for files pipecheck wrote itself (whole tables whose
// columns are not known in advance: baselines merged from several runs). Reading user input with
// line and column in every error is fccp's job.
#pragma once

#include <string>
#include <vector>

namespace pipecheck::reports {

// `field` quoted when it holds a comma, quote, CR or LF (quotes doubled), else unchanged.
std::string CsvField(const std::string& field);

// One CSV line (with "\n") from fields.
std::string CsvLine(const std::vector<std::string>& fields);

// Records of RFC 4180 text (quoted fields may hold commas, quotes and line breaks); throws
// std::runtime_error naming `name` for an unterminated quote.
std::vector<std::vector<std::string>> ParseCsv(const std::string& text, const std::string& name);

// A table with a fixed header; rows must have as many fields as the header.
class CsvTable {
 public:
  explicit CsvTable(std::vector<std::string> header);
  void AddRow(std::vector<std::string> row);
  std::string ToString() const;
  const std::vector<std::string>& header() const { return header_; }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Writes `contents` to `path` through `path.tmp.PID` and rename(2); throws std::runtime_error
// naming the path and the system's reason.
void WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace pipecheck::reports
