// How a schedule is named: a generator's name (1f1b, zbv, ...) or csv:PATH, a schedule read from
// a file. Header-only and free of LibTorch, so the scenario loader, which links no pipeline code,
// reads a name by the same rule as the trainer, the CLI and the external-trainer protocol.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pipecheck::pipeline {

inline constexpr std::string_view kScheduleCsvPrefix = "csv:";

// The PATH of "csv:PATH" (empty for "csv:" alone, which callers reject); none for a generator's name.
inline std::optional<std::string> ScheduleCsvPath(std::string_view name) {
  if (name.substr(0, kScheduleCsvPrefix.size()) != kScheduleCsvPrefix) return std::nullopt;
  return std::string(name.substr(kScheduleCsvPrefix.size()));
}

// Whether `name` is read from a file rather than generated.
inline bool IsScheduleCsv(std::string_view name) { return ScheduleCsvPath(name).has_value(); }

// The name of the schedule in the file at `path`.
inline std::string ScheduleCsvName(std::string_view path) {
  return std::string(kScheduleCsvPrefix) + std::string(path);
}

}  // namespace pipecheck::pipeline
