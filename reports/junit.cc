// JUnit XML (see junit.h).
#include "reports/junit.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <ctime>

namespace pipecheck::reports {
namespace {

double Seconds(const std::optional<double>& value) {
  return value && std::isfinite(*value) && *value >= 0 ? *value : 0.0;
}

// ISO 8601 local time without zone, as the JUnit schema's timestamp wants it.
std::string Timestamp() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm local{};
  localtime_r(&now, &local);
  std::array<char, 32> text{};
  std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%S", &local);
  return text.data();
}

std::string Hostname() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "localhost";
  return name.data();
}

void AddProperty(JUnitCase& c, const std::string& name, const std::string& value) {
  if (!value.empty()) c.properties.emplace_back(name, value);
}

}  // namespace

std::string XmlEscape(const std::string& text) {
  std::string escaped;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      case '\n': escaped += "&#10;"; break;
      case '\r': escaped += "&#13;"; break;
      case '\t': escaped += "&#9;"; break;
      default: escaped += c < 0x20 ? '?' : static_cast<char>(c);  // XML 1.0 has no other control characters
    }
  }
  return escaped;
}

JUnitCase RunCase(const ScenarioReport& report, const std::string& suite, const ComparisonRow* comparison) {
  JUnitCase c;
  c.classname = suite;
  const SummaryRow& row = report.summary;
  c.name = row.scenario;
  c.seconds = Seconds(row.wall_s);
  const std::string status = StatusName(row.status);
  const std::string& expect = row.expect;
  if (!row.ok) {
    const bool errored = row.status == Status::kError || row.status == Status::kTimeout;
    c.outcome = errored ? JUnitCase::Outcome::kError : JUnitCase::Outcome::kFailure;
    c.type = status;
    c.message = expect == "fail" && row.status == Status::kPass
                    ? "expected fail, but it passed: the injected fault was not caught"
                    : fmt::format("expected {}, got {}: {}", expect, status, row.message);
  } else if (row.status == Status::kSkipped) {
    c.outcome = JUnitCase::Outcome::kSkipped;
    c.message = row.message;
  }
  if (comparison && Fails(*comparison) && c.outcome == JUnitCase::Outcome::kPass) {
    c.outcome = JUnitCase::Outcome::kFailure;
    c.type = comparison->verdict == "CHANGED" ? "changed configuration" : "regression";
    c.message = (comparison->verdict == "CHANGED" ? "not comparable with the baseline: " : "regression against the baseline: ") + comparison->notes;
  }
  AddProperty(c, "status", status);
  AddProperty(c, "expect", expect);
  AddProperty(c, "transport", report.Get("transport"));
  AddProperty(c, "world_size", report.Get("world_size"));
  AddProperty(c, "schedule", report.Get("schedule"));
  AddProperty(c, "dtype", report.Get("dtype"));
  AddProperty(c, "device", report.Get("device"));
  AddProperty(c, "loss_max_abs_diff", report.Get("loss_max_abs_diff"));
  AddProperty(c, "grad_max_rel_err", report.Get("grad_max_rel_err"));
  AddProperty(c, "worst_param", report.Get("worst_param"));
  AddProperty(c, "pp_tokens_per_s", report.Get("pp_tokens_per_s"));
  AddProperty(c, "pp_peak_bytes_max", report.Get("pp_peak_bytes_max"));
  if (comparison) {
    AddProperty(c, "throughput_change", comparison->throughput_change);
    AddProperty(c, "throughput_limit", comparison->throughput_limit);
    AddProperty(c, "memory_change", comparison->memory_change);
    AddProperty(c, "baseline_verdict", comparison->verdict);
    // What the comparison said: a warning's reason is not a failure, but CI must be able to read it.
    AddProperty(c, "baseline_notes", comparison->notes);
  }
  return c;
}

JUnitCase CompareCase(const ComparisonRow& row, const std::string& baseline) {
  JUnitCase c;
  c.classname = "compare " + baseline;
  c.name = row.scenario;
  if (Fails(row)) {
    c.outcome = JUnitCase::Outcome::kFailure;
    c.type = row.verdict == "CHANGED" ? "changed configuration" : "regression";
    c.message = row.notes;
  }
  for (const char* column : {"verdict", "baseline_status", "current_status", "baseline_tokens_per_s",
                             "current_tokens_per_s", "throughput_change", "throughput_limit", "baseline_peak_bytes",
                             "current_peak_bytes", "memory_change", "notes"}) {
    AddProperty(c, column, CellOf(ComparisonFields(), row, column));
  }
  return c;
}

std::string JUnitXml(const std::string& suite_name, const std::vector<JUnitCase>& cases) {
  int failures = 0, errors = 0, skipped = 0;
  double seconds = 0.0;
  std::string body;
  for (const auto& c : cases) {
    failures += c.outcome == JUnitCase::Outcome::kFailure;
    errors += c.outcome == JUnitCase::Outcome::kError;
    skipped += c.outcome == JUnitCase::Outcome::kSkipped;
    seconds += c.seconds;
    body += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\">\n", XmlEscape(c.classname),
                        XmlEscape(c.name), c.seconds);
    if (!c.properties.empty()) {
      body += "      <properties>\n";
      for (const auto& [name, value] : c.properties) {
        body += fmt::format("        <property name=\"{}\" value=\"{}\"/>\n", XmlEscape(name), XmlEscape(value));
      }
      body += "      </properties>\n";
    }
    switch (c.outcome) {
      case JUnitCase::Outcome::kFailure:
      case JUnitCase::Outcome::kError: {
        const char* element = c.outcome == JUnitCase::Outcome::kFailure ? "failure" : "error";
        body += fmt::format("      <{} message=\"{}\" type=\"{}\">{}</{}>\n", element, XmlEscape(c.message),
                            XmlEscape(c.type), XmlEscape(c.message), element);
        break;
      }
      case JUnitCase::Outcome::kSkipped:
        body += fmt::format("      <skipped message=\"{}\"/>\n", XmlEscape(c.message));
        break;
      case JUnitCase::Outcome::kPass:
        break;
    }
    body += "    </testcase>\n";
  }
  const std::string counts = fmt::format("tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3f}\"",
                                         cases.size(), failures, errors, skipped, seconds);
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                     "<testsuites name=\"pipecheck\" {}>\n"
                     "  <testsuite name=\"{}\" {} timestamp=\"{}\" hostname=\"{}\">\n{}  </testsuite>\n"
                     "</testsuites>\n",
                     counts, XmlEscape(suite_name), counts, Timestamp(), XmlEscape(Hostname()), body);
}

}  // namespace pipecheck::reports
