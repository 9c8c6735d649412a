// Lists of small records (an executed action, a boundary fingerprint, a message) packed column by
// column under each field's name, so what travels between processes is read back by name: a field
// added, removed or moved in a record's table cannot shift the others, and a field the reader
// expects but the bytes lack is an error naming it, not a silent misreading.
#pragma once

#include <ATen/core/Dict.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipecheck::pipeline {

// One field of a record type R: its name and how to read and write it, as an int64 (exact: ids,
// counts, byte sizes, hashes) or as a double (times, sums).
template <typename R>
struct RecordField {
  std::string name;
  bool whole = false;  // int64 column, else float64
  std::function<int64_t(const R&)> get_whole;
  std::function<void(R&, int64_t)> set_whole;
  std::function<double(const R&)> get_real;
  std::function<void(R&, double)> set_real;
};

template <typename R>
RecordField<R> WholeField(std::string name, std::function<int64_t(const R&)> get, std::function<void(R&, int64_t)> set) {
  RecordField<R> field;
  field.name = std::move(name);
  field.whole = true;
  field.get_whole = std::move(get);
  field.set_whole = std::move(set);
  return field;
}

template <typename R>
RecordField<R> RealField(std::string name, std::function<double(const R&)> get, std::function<void(R&, double)> set) {
  RecordField<R> field;
  field.name = std::move(name);
  field.get_real = std::move(get);
  field.set_real = std::move(set);
  return field;
}

// `records` as a dict from each field's name to its column (a 1-D int64 or float64 tensor).
template <typename R>
c10::impl::GenericDict PackRecords(const std::vector<R>& records, const std::vector<RecordField<R>>& fields) {
  c10::impl::GenericDict columns(c10::StringType::get(), c10::AnyType::get());
  const auto count = static_cast<int64_t>(records.size());
  for (const auto& field : fields) {
    if (columns.contains(field.name)) throw std::logic_error("record field '" + field.name + "' listed twice");
    if (field.whole) {
      auto column = torch::empty({count}, torch::kInt64);
      auto* out = column.data_ptr<int64_t>();
      for (int64_t i = 0; i < count; ++i) out[i] = field.get_whole(records[i]);
      columns.insert(field.name, column);
    } else {
      auto column = torch::empty({count}, torch::kFloat64);
      auto* out = column.data_ptr<double>();
      for (int64_t i = 0; i < count; ++i) out[i] = field.get_real(records[i]);
      columns.insert(field.name, column);
    }
  }
  return columns;
}

// The records PackRecords packed, read by field name. `what` names the list in errors. Columns
// the fields do not name are ignored; a field whose column is missing, of another type or of
// another length is an error naming it.
template <typename R>
std::vector<R> UnpackRecords(const c10::impl::GenericDict& columns, const std::vector<RecordField<R>>& fields,
                             const std::string& what) {
  int64_t count = -1;
  std::vector<torch::Tensor> found;
  for (const auto& field : fields) {
    if (!columns.contains(field.name)) {
      throw std::runtime_error(what + ": no column '" + field.name + "' in the packed records");
    }
    auto column = columns.at(field.name).toTensor().contiguous();
    const auto want = field.whole ? torch::kInt64 : torch::kFloat64;
    if (column.dim() != 1 || column.scalar_type() != want) {
      throw std::runtime_error(what + ": column '" + field.name + "' is not a 1-D " +
                               std::string(c10::toString(want)) + " list");
    }
    if (count >= 0 && column.size(0) != count) {
      throw std::runtime_error(what + ": column '" + field.name + "' holds " + std::to_string(column.size(0)) +
                               " values where the others hold " + std::to_string(count));
    }
    count = column.size(0);
    found.push_back(column);
  }
  std::vector<R> records(static_cast<size_t>(count < 0 ? 0 : count));
  for (size_t f = 0; f < fields.size(); ++f) {
    const auto& field = fields[f];
    for (int64_t i = 0; i < count; ++i) {
      if (field.whole) {
        field.set_whole(records[i], found[f].data_ptr<int64_t>()[i]);
      } else {
        field.set_real(records[i], found[f].data_ptr<double>()[i]);
      }
    }
  }
  return records;
}

}  // namespace pipecheck::pipeline
