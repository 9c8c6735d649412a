// Chrome trace and SVG timeline of a scenario's executed actions (see trace.h).
#include "reports/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "reports/csv.h"

namespace pipecheck::reports {
namespace {

// One executed action, from its timeline row; times in µs on the run's clock.
struct Event {
  int rank = 0;
  int64_t step = 0;
  std::string kind;  // F, B, I, W, SEND_F, ...
  int stage = 0, microbatch = 0;
  double wait_start = 0, start = 0, end = 0;
  std::string held_bytes, held_bytes_predicted, peak_bytes, peak_bytes_predicted;

  // "1F3"; a step-wide action (the data-parallel ALLREDUCE, stage -1) by its kind alone.
  std::string Name() const { return stage < 0 ? kind : fmt::format("{}{}{}", stage, kind, microbatch); }
};

// A byte count as a trace argument: its digits, or "" where none was measured.
std::string ByteDigits(const std::optional<int64_t>& bytes) { return bytes ? std::to_string(*bytes) : ""; }

std::vector<Event> EventsOf(const ScenarioReport& report) {
  std::vector<Event> events;
  for (const auto& row : report.timeline) {
    Event e;
    e.rank = static_cast<int>(row.rank);
    e.step = row.step;
    e.kind = row.action;
    e.stage = static_cast<int>(row.stage);
    e.microbatch = static_cast<int>(row.microbatch);
    const double step_start = row.step_start_us.value_or(0.0);
    e.wait_start = step_start + row.wait_start_us;
    e.start = step_start + row.start_us;
    e.end = step_start + row.end_us;
    e.held_bytes = ByteDigits(row.held_bytes);
    e.held_bytes_predicted = ByteDigits(row.held_bytes_predicted);
    e.peak_bytes = ByteDigits(row.peak_bytes);
    e.peak_bytes_predicted = ByteDigits(row.peak_bytes_predicted);
    events.push_back(e);
  }
  return events;
}

bool IsCompute(const std::string& kind) { return kind == "F" || kind == "B" || kind == "I" || kind == "W"; }

// Colour-blind-safe (Okabe-Ito) fills per kind; communication grey, waits light hatched grey.
std::string FillOf(const std::string& kind) {
  if (kind == "F") return "#0072B2";
  if (kind == "B") return "#E69F00";
  if (kind == "I") return "#D55E00";
  if (kind == "W") return "#009E73";
  if (kind == "ALLREDUCE") return "#CC79A7";
  return "#999999";
}

// Each step's start on the run's clock: the earliest start among the ranks.
std::map<int64_t, double> StepStarts(const std::vector<Event>& events) {
  std::map<int64_t, double> starts;
  for (const auto& e : events) {
    auto [it, inserted] = starts.emplace(e.step, e.wait_start);
    if (!inserted) it->second = std::min(it->second, e.wait_start);
  }
  return starts;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string ChromeTrace(const ScenarioReport& report) {
  const auto events = EventsOf(report);
  const std::string scenario = report.summary.scenario;
  nlohmann::json trace_events = nlohmann::json::array();
  trace_events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", scenario}}}});
  std::map<int, bool> ranks;
  for (const auto& e : events) ranks[e.rank] = true;
  for (const auto& [rank, unused] : ranks) {
    trace_events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                            {"args", {{"name", fmt::format("rank {}", rank)}}}});
    trace_events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                            {"args", {{"sort_index", rank}}}});
  }
  for (const auto& [step, start] : StepStarts(events)) {
    trace_events.push_back({{"name", fmt::format("step {}", step)}, {"cat", "step"}, {"ph", "i"}, {"s", "p"},
                            {"ts", start}, {"pid", 0}, {"tid", ranks.empty() ? 0 : ranks.begin()->first}});
  }
  for (const auto& e : events) {
    if (e.start > e.wait_start) {
      trace_events.push_back({{"name", fmt::format("wait for {}'s input", e.Name())}, {"cat", "wait"}, {"ph", "X"},
                              {"ts", e.wait_start}, {"dur", e.start - e.wait_start}, {"pid", 0}, {"tid", e.rank},
                              {"args", {{"step", e.step}}}});
    }
    trace_events.push_back({{"name", e.Name()}, {"cat", IsCompute(e.kind) ? e.kind : "comm"}, {"ph", "X"},
                            {"ts", e.start}, {"dur", std::max(0.0, e.end - e.start)}, {"pid", 0}, {"tid", e.rank},
                            {"args", {{"step", e.step}, {"stage", e.stage}, {"microbatch", e.microbatch},
                                      {"held_bytes", e.held_bytes}, {"held_bytes_predicted", e.held_bytes_predicted},
                                      {"peak_bytes", e.peak_bytes}, {"peak_bytes_predicted", e.peak_bytes_predicted}}}});
  }
  nlohmann::json trace = {{"traceEvents", trace_events}, {"displayTimeUnit", "ms"},
                          {"otherData", {{"scenario", scenario}, {"clock", "µs since the ranks' rendezvous"}}}};
  return trace.dump(1) + "\n";
}

namespace {

constexpr double kLeft = 70, kWidth = 1100, kTop = 40, kRow = 34, kBar = 24, kLegendRow = 20;

// The picture's time coordinates: the ranks shown, and the span from the first wait to the last end.
struct Canvas {
  int ranks = 0;
  double first = 0, span = 1;
  double X(double us) const { return kLeft + (us - first) / span * kWidth; }
};

Canvas CanvasOf(const std::vector<Event>& events) {
  Canvas canvas;
  double last = 1;
  if (!events.empty()) {
    canvas.first = events.front().wait_start;
    last = events.front().end;
  }
  for (const auto& e : events) {
    canvas.ranks = std::max(canvas.ranks, e.rank + 1);
    canvas.first = std::min(canvas.first, e.wait_start);
    last = std::max(last, e.end);
  }
  canvas.span = std::max(last - canvas.first, 1.0);
  return canvas;
}

// The legend's entries (label, fill; no fill: a note), laid out first: they wrap onto further rows
// rather than run off the picture's right edge, and the picture grows to hold them.
struct Legend {
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<std::pair<double, int>> at;  // x and row of each entry
  int rows = 1;
};

Legend LegendOf(const std::vector<Event>& events) {
  Legend legend;
  legend.entries = {{"F forward", FillOf("F")}, {"B backward", FillOf("B")}, {"I input gradient", FillOf("I")},
                    {"W weight gradient", FillOf("W")}, {"send/receive", FillOf("SEND_F")},
                    {"waiting for a message", "url(#wait)"}};
  if (std::any_of(events.begin(), events.end(), [](const Event& e) { return e.kind == "ALLREDUCE"; })) {
    legend.entries.emplace_back("all-reduce across replicas", FillOf("ALLREDUCE"));
  }
  legend.entries.emplace_back("blank: idle (bubble)", "");
  double x = kLeft;
  for (const auto& [label, fill] : legend.entries) {
    const double width = (fill.empty() ? 0 : 18) + 22 + 7.0 * static_cast<double>(label.size());
    if (x > kLeft && x + width > kLeft + kWidth) {
      x = kLeft;
      ++legend.rows;
    }
    legend.at.emplace_back(x, legend.rows - 1);
    x += width;
  }
  return legend;
}

// The document's head: size, the wait pattern, the title (what the picture shows: its ranks, and
// with replicas, which one, each running the same list).
std::string SvgHead(const ScenarioReport& report, const Canvas& canvas, const Legend& legend) {
  const double height = kTop + canvas.ranks * kRow + 70 + kLegendRow * (legend.rows - 1);
  const int64_t replicas = report.summary.data_parallel;
  const std::string shows =
      fmt::format("{} rank{}{}", canvas.ranks, canvas.ranks == 1 ? "" : "s",
                  replicas > 1 ? fmt::format(", replica 0 of {} (every replica runs the same actions)", replicas) : "");
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n"
      "<defs><pattern id=\"wait\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bbbbbb\" stroke-width=\"2\"/></pattern></defs>\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"20\" font-size=\"14\">{} — {:.1f} ms, {}</text>\n",
      kLeft + kWidth + 20, height, kLeft, Escape(report.summary.scenario), canvas.span / 1000.0, Escape(shows));
}

// A lane per rank, and a dashed line where each step starts.
std::string SvgLanes(const std::vector<Event>& events, const Canvas& canvas) {
  std::string svg;
  for (int r = 0; r < canvas.ranks; ++r) {
    const double y = kTop + r * kRow;
    svg += fmt::format("<text x=\"8\" y=\"{:.1f}\">rank {}</text>\n", y + kBar * 0.7, r);
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#dddddd\"/>\n", kLeft,
                       y + kBar, kLeft + kWidth, y + kBar);
  }
  for (const auto& [step, start] : StepStarts(events)) {
    svg += fmt::format("<line class=\"step\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
                       "stroke=\"#333333\" stroke-dasharray=\"4 3\"/><text x=\"{3:.1f}\" y=\"{4:.1f}\" "
                       "font-size=\"10\">step {5}</text>\n",
                       canvas.X(start), kTop - 6, kTop + canvas.ranks * kRow, canvas.X(start) + 3, kTop - 8, step);
  }
  return svg;
}

// Each action as a bar (compute full height, communication thin), after the wait before it.
std::string SvgActions(const std::vector<Event>& events, const Canvas& canvas) {
  std::string svg;
  for (const auto& e : events) {
    const double y = kTop + e.rank * kRow;
    if (e.start > e.wait_start) {
      svg += fmt::format("<rect class=\"wait\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" "
                         "fill=\"url(#wait)\"><title>rank {} step {}: waiting for {}'s input, {:.2f} ms</title></rect>\n",
                         canvas.X(e.wait_start), y + kBar * 0.25,
                         std::max(0.0, canvas.X(e.start) - canvas.X(e.wait_start)), kBar * 0.5, e.rank, e.step,
                         e.Name(), (e.start - e.wait_start) / 1000.0);
    }
    const bool compute = IsCompute(e.kind);
    const double bar_y = compute ? y : y + kBar * 0.35, bar_h = compute ? kBar : kBar * 0.3;
    svg += fmt::format("<rect class=\"action\" data-rank=\"{}\" data-step=\"{}\" data-action=\"{}\" x=\"{:.2f}\" "
                       "y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
                       "stroke-width=\"0.5\"><title>rank {} step {}: {} {:.2f}–{:.2f} ms</title></rect>\n",
                       e.rank, e.step, e.Name(), canvas.X(e.start), bar_y,
                       std::max(0.5, canvas.X(e.end) - canvas.X(e.start)), bar_h, FillOf(e.kind), e.rank, e.step,
                       e.Name(), (e.start - canvas.first) / 1000.0, (e.end - canvas.first) / 1000.0);
  }
  return svg;
}

// The time axis under the lanes, and the legend under it.
std::string SvgAxisAndLegend(const Canvas& canvas, const Legend& legend) {
  std::string svg;
  const double axis_y = kTop + canvas.ranks * kRow + 8;
  for (int tick = 0; tick <= 10; ++tick) {
    const double at = kLeft + kWidth * tick / 10.0;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{:.1f} ms</text>\n",
                       at, axis_y + 10, canvas.span / 1000.0 * tick / 10.0);
  }
  for (size_t i = 0; i < legend.entries.size(); ++i) {
    const auto& [label, fill] = legend.entries[i];
    const auto [at_x, row] = legend.at[i];
    const double y = axis_y + kLegendRow * row;
    if (fill.empty()) {
      svg += fmt::format("<text class=\"legend\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#555555\">{}</text>\n",
                         at_x, y + 35, label);
      continue;
    }
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"14\" fill=\"{}\"/><text class=\"legend\" "
                       "x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
                       at_x, y + 24, fill, at_x + 18, y + 35, label);
  }
  return svg;
}

}  // namespace

// One SVG document written top to bottom: head, lanes and steps, actions, axis and legend.
std::string TimelineSvg(const ScenarioReport& report) {
  const auto events = EventsOf(report);
  const Canvas canvas = CanvasOf(events);
  const Legend legend = LegendOf(events);
  return SvgHead(report, canvas, legend) + SvgLanes(events, canvas) + SvgActions(events, canvas) +
         SvgAxisAndLegend(canvas, legend) + "</svg>\n";
}

std::vector<std::string> WriteTimelineViews(const std::string& directory, const ScenarioReport& report) {
  if (report.timeline.empty()) return {};
  const auto folder = std::filesystem::path(directory) / "views" / report.summary.scenario;
  std::filesystem::create_directories(folder);
  const std::string trace = (folder / "trace.json").string(), svg = (folder / "timeline.svg").string();
  WriteFileAtomically(trace, ChromeTrace(report));
  WriteFileAtomically(svg, TimelineSvg(report));
  return {trace, svg};
}

}  // namespace pipecheck::reports
