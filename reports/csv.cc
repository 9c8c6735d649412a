// CSV writing and atomic file replacement (see csv.h).
#include "reports/csv.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace pipecheck::reports {

std::string CsvField(const std::string& field) {
  if (field.find_first_of(",\"\r\n") == std::string::npos) return field;
  std::string quoted = "\"";
  for (char c : field) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

std::string CsvLine(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) line += ',';
    line += CsvField(fields[i]);
  }
  return line + "\n";
}

std::vector<std::vector<std::string>> ParseCsv(const std::string& text, const std::string& name) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
      continue;
    }
    if (c == '"') {
      quoted = any = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
      any = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        record.push_back(std::move(field));
        records.push_back(std::move(record));
      }
      record.clear();
      field.clear();
      any = false;
    } else {
      field += c;
      any = true;
    }
  }
  if (quoted) throw std::runtime_error(fmt::format("{}: a quoted field is not closed", name));
  if (any || !field.empty()) {
    record.push_back(std::move(field));
    records.push_back(std::move(record));
  }
  return records;
}

CsvTable::CsvTable(std::vector<std::string> header) : header_(std::move(header)) {}

void CsvTable::AddRow(std::vector<std::string> row) {
  if (row.size() != header_.size()) {
    throw std::logic_error(fmt::format("CSV row has {} fields, header has {}", row.size(), header_.size()));
  }
  rows_.push_back(std::move(row));
}

std::string CsvTable::ToString() const {
  std::string text = CsvLine(header_);
  for (const auto& row : rows_) text += CsvLine(row);
  return text;
}

void WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, getpid());
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw std::runtime_error(fmt::format("cannot write {}: {} failed: {}", path, what, reason));
  };
  FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) fail("open");
  const bool written = std::fwrite(contents.data(), 1, contents.size(), file) == contents.size();
  const bool flushed = std::fflush(file) == 0 && fsync(fileno(file)) == 0;
  if (std::fclose(file) != 0 || !written || !flushed) fail("write");
  if (std::rename(temporary.c_str(), path.c_str()) != 0) fail("rename");
}

}  // namespace pipecheck::reports
