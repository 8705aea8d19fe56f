// Small, dependency-free SVG charts for the run report: line charts (several series, optional
// vertical event markers) and stacked area charts, with "nice" axis ticks and a legend. The output
// is inline SVG text, so a report page needs no network and no JavaScript.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace meshtrain::obs {

struct ChartSeries {
  std::string name;
  std::string color;                              // CSS colour
  std::vector<std::pair<double, double>> points;  // (x, y), x increasing
};

struct ChartOptions {
  std::string id;  // the <svg> element's id
  std::string title;
  std::string x_label;
  std::string y_label;
  int width = 920;
  int height = 300;
  bool y_from_zero = false;
  std::vector<std::pair<double, std::string>> markers;  // vertical lines at x, with a label
};

// Long series are thinned to about this many points per series (min and max of each bin kept, so
// spikes survive).
inline constexpr size_t kMaxChartPoints = 1500;

std::string line_chart_svg(const std::vector<ChartSeries>& series, const ChartOptions& options);
// Series are stacked in order (the first at the bottom); all must share the same x values.
std::string stacked_area_svg(const std::vector<ChartSeries>& series, const ChartOptions& options);

// Tick positions covering [lo, hi] at 1, 2 or 5 times a power of ten, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);
std::string html_escape(const std::string& s);

}  // namespace meshtrain::obs
