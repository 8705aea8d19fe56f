// See svg_chart.h. Coordinates are computed here rather than with SVG transforms so that text is
// never scaled and every element has plain numeric attributes (which the report test checks).
#include "meshtrain/obs/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace meshtrain::obs {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (hi <= lo) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string tick_label(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3))
    std::snprintf(buf, sizeof(buf), "%.1e", v);
  else if (a >= 100 || v == std::floor(v))
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  else
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

// Keeps the first and last point and, per bin, the minimum and maximum.
std::vector<std::pair<double, double>> thin(const std::vector<std::pair<double, double>>& pts) {
  if (pts.size() <= kMaxChartPoints) return pts;
  const size_t bins = kMaxChartPoints / 2;
  const size_t per = (pts.size() + bins - 1) / bins;
  std::vector<std::pair<double, double>> out;
  for (size_t b = 0; b < pts.size(); b += per) {
    const size_t e = std::min(pts.size(), b + per);
    auto [mn, mx] =
        std::minmax_element(pts.begin() + static_cast<long>(b), pts.begin() + static_cast<long>(e),
                            [](auto& a, auto& c) { return a.second < c.second; });
    if (mn - pts.begin() <= mx - pts.begin()) {
      out.push_back(*mn);
      if (mx != mn) out.push_back(*mx);
    } else {
      out.push_back(*mx);
      out.push_back(*mn);
    }
  }
  if (out.back() != pts.back()) out.push_back(pts.back());
  return out;
}

struct Frame {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // data range
  double left = 70, right = 20, top = 34, bottom = 46;
  int width = 0, height = 0;
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (width - left - right); }
  double py(double y) const {
    return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom);
  }
};

Frame make_frame(const std::vector<ChartSeries>& series, const ChartOptions& o, bool stacked) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  std::vector<double> stack;
  for (const auto& s : series) {
    if (stacked && stack.size() < s.points.size()) stack.resize(s.points.size(), 0.0);
    for (size_t i = 0; i < s.points.size(); ++i) {
      const auto [x, y] = s.points[i];
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      const double v = stacked ? (stack[i] += y) : y;
      y0 = std::min(y0, v);
      y1 = std::max(y1, v);
    }
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (o.y_from_zero || stacked) y0 = std::min(0.0, y0);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1);
  const double pad = (y1 - y0) * 0.05;
  if (!(o.y_from_zero || stacked) || y0 < 0) y0 -= pad;
  y1 += pad;
  Frame f;
  f.x0 = x0;
  f.x1 = x1;
  f.y0 = y0;
  f.y1 = y1;
  f.width = o.width;
  f.height = o.height;
  return f;
}

void open_svg(std::ostringstream& os, const Frame& f, const ChartOptions& o) {
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" << html_escape(o.id)
     << "\" class=\"chart\""
     << " width=\"" << o.width << "\" height=\"" << o.height << "\" viewBox=\"0 0 " << o.width
     << " " << o.height << "\" role=\"img\" aria-label=\"" << html_escape(o.title) << "\">\n";
  os << "<rect x=\"0\" y=\"0\" width=\"" << o.width << "\" height=\"" << o.height
     << "\" fill=\"#ffffff\"/>\n";
  os << "<text x=\"" << f.left << "\" y=\"20\" class=\"title\">" << html_escape(o.title)
     << "</text>\n";
  const double plot_bottom = f.height - f.bottom, plot_right = f.width - f.right;
  for (double t : nice_ticks(f.y0, f.y1, 5)) {
    if (t < f.y0 || t > f.y1) continue;
    os << "<line class=\"grid\" x1=\"" << fmt(f.left) << "\" x2=\"" << fmt(plot_right) << "\" y1=\""
       << fmt(f.py(t)) << "\" y2=\"" << fmt(f.py(t)) << "\"/>"
       << "<text class=\"tick\" x=\"" << fmt(f.left - 6) << "\" y=\"" << fmt(f.py(t) + 4)
       << "\" text-anchor=\"end\">" << tick_label(t) << "</text>\n";
  }
  for (double t : nice_ticks(f.x0, f.x1, 8)) {
    if (t < f.x0 || t > f.x1) continue;
    os << "<line class=\"grid\" x1=\"" << fmt(f.px(t)) << "\" x2=\"" << fmt(f.px(t)) << "\" y1=\""
       << fmt(f.top) << "\" y2=\"" << fmt(plot_bottom) << "\"/>"
       << "<text class=\"tick\" x=\"" << fmt(f.px(t)) << "\" y=\"" << fmt(plot_bottom + 16)
       << "\" text-anchor=\"middle\">" << tick_label(t) << "</text>\n";
  }
  os << "<rect class=\"frame\" x=\"" << fmt(f.left) << "\" y=\"" << fmt(f.top) << "\" width=\""
     << fmt(plot_right - f.left) << "\" height=\"" << fmt(plot_bottom - f.top) << "\"/>\n";
  os << "<text class=\"axis\" x=\"" << fmt((f.left + plot_right) / 2) << "\" y=\""
     << fmt(f.height - 8.0) << "\" text-anchor=\"middle\">" << html_escape(o.x_label)
     << "</text>\n";
  os << "<text class=\"axis\" transform=\"rotate(-90)\" x=\"" << fmt(-(f.top + plot_bottom) / 2)
     << "\" y=\"16\" text-anchor=\"middle\">" << html_escape(o.y_label) << "</text>\n";
}

void markers_and_legend(std::ostringstream& os, const Frame& f, const ChartOptions& o,
                        const std::vector<ChartSeries>& series) {
  for (const auto& [x, label] : o.markers) {
    if (x < f.x0 || x > f.x1) continue;
    os << "<line class=\"marker\" x1=\"" << fmt(f.px(x)) << "\" x2=\"" << fmt(f.px(x)) << "\" y1=\""
       << fmt(f.top) << "\" y2=\"" << fmt(f.height - f.bottom) << "\"><title>" << html_escape(label)
       << "</title></line>\n";
  }
  double lx = f.width - f.right - 8;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    const double w = 26 + 7.5 * static_cast<double>(it->name.size());
    lx -= w;
    os << "<rect class=\"legend\" x=\"" << fmt(lx)
       << "\" y=\"10\" width=\"10\" height=\"10\" fill=\"" << html_escape(it->color)
       << "\"/><text class=\"tick\" x=\"" << fmt(lx + 14) << "\" y=\"19\">" << html_escape(it->name)
       << "</text>\n";
  }
}

}  // namespace

std::string line_chart_svg(const std::vector<ChartSeries>& series, const ChartOptions& o) {
  const Frame f = make_frame(series, o, false);
  std::ostringstream os;
  open_svg(os, f, o);
  for (const auto& s : series) {
    std::ostringstream pts;
    size_t n = 0;
    for (const auto& [x, y] : thin(s.points)) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      pts << (n++ ? " " : "") << fmt(f.px(x)) << "," << fmt(f.py(y));
    }
    if (n == 0) continue;
    if (n == 1 || s.points.size() < 40) {
      // Sparse series (validation loss) get dots so single points are visible.
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          os << "<circle cx=\"" << fmt(f.px(x)) << "\" cy=\"" << fmt(f.py(y))
             << "\" r=\"3\" fill=\"" << html_escape(s.color) << "\"/>";
      os << "\n";
    }
    os << "<polyline class=\"series\" data-series=\"" << html_escape(s.name)
       << "\" fill=\"none\" stroke=\"" << html_escape(s.color)
       << "\" stroke-width=\"1.6\" points=\"" << pts.str() << "\"/>\n";
  }
  markers_and_legend(os, f, o, series);
  os << "</svg>\n";
  return os.str();
}

std::string stacked_area_svg(const std::vector<ChartSeries>& series, const ChartOptions& o) {
  const Frame f = make_frame(series, o, true);
  std::ostringstream os;
  open_svg(os, f, o);
  const size_t n = series.empty() ? 0 : series.front().points.size();
  std::vector<double> base(n, 0.0);
  // Thin by index so all layers keep the same x values.
  const size_t stride = std::max<size_t>(1, n / kMaxChartPoints + 1);
  for (const auto& s : series) {
    std::vector<double> top = base;
    for (size_t i = 0; i < n && i < s.points.size(); ++i)
      if (std::isfinite(s.points[i].second)) top[i] += s.points[i].second;
    std::ostringstream d;
    bool first = true;
    for (size_t i = 0; i < n; i += stride) {
      d << (first ? "M" : " L") << fmt(f.px(s.points[i].first)) << "," << fmt(f.py(top[i]));
      first = false;
    }
    for (size_t k = (n - 1) / stride + 1; k-- > 0;) {
      const size_t i = k * stride;
      d << " L" << fmt(f.px(s.points[i].first)) << "," << fmt(f.py(base[i]));
    }
    if (n > 0)
      os << "<path class=\"area\" data-series=\"" << html_escape(s.name) << "\" d=\"" << d.str()
         << " Z\" fill=\"" << html_escape(s.color)
         << "\" fill-opacity=\"0.85\" stroke=\"none\"/>\n";
    base = std::move(top);
  }
  markers_and_legend(os, f, o, series);
  os << "</svg>\n";
  return os.str();
}

}  // namespace meshtrain::obs
