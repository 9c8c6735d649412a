// Report rows as typed values, each row type with one field table: its CSV header and cells, the
// JSON a rank hands the launcher, and every reader of the files come from that table, so a column
// is named and formatted in one place. Cells: text as it is; integers in decimal; reals as the
// shortest text that reads back to the same double ("nan" for NaN); what was not measured
// (std::optional) as an empty cell; flags as 1 or 0.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipecheck::reports {

// Numbers as reports hold them: shortest text that reads back to the same double.
std::string FormatNumber(double value);

// A cell that does not read as its field: the message names the column and the value.
class FieldError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The outcome of a scenario, as reports spell it: PASS, FAIL, ERROR, TIMEOUT, SKIPPED.
enum class Status { kPass, kFail, kError, kTimeout, kSkipped };
const char* StatusName(Status status);
Status ParseStatus(const std::string& text);  // throws FieldError

template <typename Row>
struct Field {
  std::string name;
  std::function<std::string(const Row&)> format;
  std::function<void(Row&, const std::string&)> parse;  // throws FieldError
};

template <typename Row>
using Fields = std::vector<Field<Row>>;

namespace cell {
// Readers for one cell of column `column`; each throws FieldError on what is not its type.
int64_t ParseInteger(const std::string& column, const std::string& text);
double ParseReal(const std::string& column, const std::string& text);  // "nan" is NaN
bool ParseFlag(const std::string& column, const std::string& text);
}  // namespace cell

namespace field {

template <typename Row>
Field<Row> Text(std::string name, std::string Row::*member) {
  return {std::move(name), [member](const Row& row) { return row.*member; },
          [member](Row& row, const std::string& text) { row.*member = text; }};
}

template <typename Row, typename Int>
Field<Row> Integer(std::string name, Int Row::*member) {
  return {name, [member](const Row& row) { return std::to_string(row.*member); },
          [member, name](Row& row, const std::string& text) {
            row.*member = static_cast<Int>(cell::ParseInteger(name, text));
          }};
}

// A field that may hold nothing (an empty cell): `field` formats and reads its value when there is one.
template <typename Row, typename Value>
Field<Row> Optional(std::optional<Value> Row::*member, const Field<Value>& field) {
  return {field.name,
          [member, format = field.format](const Row& row) { return row.*member ? format(*(row.*member)) : std::string(); },
          [member, parse = field.parse](Row& row, const std::string& text) {
            if (text.empty()) {
              row.*member = std::nullopt;
              return;
            }
            Value value{};
            parse(value, text);
            row.*member = value;
          }};
}

// The field of a plain value (no row around it), for Optional.
template <typename Value>
Field<Value> Plain(std::string name, std::string (*format)(Value), Value (*parse)(const std::string&, const std::string&)) {
  return {name, [format](const Value& value) { return format(value); },
          [parse, name](Value& value, const std::string& text) { value = parse(name, text); }};
}

inline std::string IntegerText(int64_t value) { return std::to_string(value); }
inline std::string FlagText(bool value) { return value ? "1" : "0"; }

template <typename Row>
Field<Row> OptionalInteger(std::string name, std::optional<int64_t> Row::*member) {
  return Optional(member, Plain<int64_t>(std::move(name), IntegerText, cell::ParseInteger));
}

template <typename Row>
Field<Row> Real(std::string name, double Row::*member) {
  return {name, [member](const Row& row) { return FormatNumber(row.*member); },
          [member, name](Row& row, const std::string& text) { row.*member = cell::ParseReal(name, text); }};
}

template <typename Row>
Field<Row> OptionalReal(std::string name, std::optional<double> Row::*member) {
  return Optional(member, Plain<double>(std::move(name), FormatNumber, cell::ParseReal));
}

template <typename Row>
Field<Row> Flag(std::string name, bool Row::*member) {
  return {name, [member](const Row& row) { return std::string(row.*member ? "1" : "0"); },
          [member, name](Row& row, const std::string& text) { row.*member = cell::ParseFlag(name, text); }};
}

template <typename Row>
Field<Row> OptionalFlag(std::string name, std::optional<bool> Row::*member) {
  return Optional(member, Plain<bool>(std::move(name), FlagText, cell::ParseFlag));
}

template <typename Row>
Field<Row> StatusOf(std::string name, Status Row::*member) {
  return {std::move(name), [member](const Row& row) { return std::string(StatusName(row.*member)); },
          [member](Row& row, const std::string& text) { row.*member = ParseStatus(text); }};
}

}  // namespace field

template <typename Row>
std::vector<std::string> Header(const Fields<Row>& fields) {
  std::vector<std::string> names;
  for (const auto& f : fields) names.push_back(f.name);
  return names;
}

// Header(fields), built once: each row type has the one table `fields`.
template <typename Row>
const std::vector<std::string>& ColumnsOf(const Fields<Row>& fields) {
  static const std::vector<std::string> columns = Header(fields);
  return columns;
}

template <typename Row>
std::vector<std::string> Cells(const Fields<Row>& fields, const Row& row) {
  std::vector<std::string> cells;
  for (const auto& f : fields) cells.push_back(f.format(row));
  return cells;
}

// The cell of column `name`, formatted; "" for a column the table does not have.
template <typename Row>
std::string CellOf(const Fields<Row>& fields, const Row& row, const std::string& name) {
  for (const auto& f : fields) {
    if (f.name == name) return f.format(row);
  }
  return "";
}

// A row read from `cells` under `header`: columns the table does not know are ignored, and fields
// the header lacks keep their defaults (older files have fewer columns).
template <typename Row>
Row ParseCells(const Fields<Row>& fields, const std::vector<std::string>& header, const std::vector<std::string>& cells) {
  Row row;
  for (size_t i = 0; i < header.size() && i < cells.size(); ++i) {
    for (const auto& f : fields) {
      if (f.name == header[i]) {
        f.parse(row, cells[i]);
        break;
      }
    }
  }
  return row;
}

// A row whose cells are in the table's own order (as Cells wrote them).
template <typename Row>
Row ParseInOrder(const Fields<Row>& fields, const std::vector<std::string>& cells) {
  Row row;
  for (size_t i = 0; i < fields.size() && i < cells.size(); ++i) fields[i].parse(row, cells[i]);
  return row;
}

}  // namespace pipecheck::reports
