// SVG loss curves: data -> pixel mapping, "nice" 1-2-5 ticks, polylines and markers.
#include "core/io/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "base/error.h"

namespace weft::core::io {
namespace {

struct Point {
  double x, y;
};

std::vector<Point> series(const std::vector<MetricsRow>& rows, const char* key) {
  std::vector<Point> pts;
  for (const MetricsRow& r : rows) {
    auto s = r.get("step");
    auto v = r.get(key);
    if (s && v && std::isfinite(*s) && std::isfinite(*v)) pts.push_back({*s, *v});
  }
  return pts;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
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

// Tick spacing from {1, 2, 5} x 10^k giving about `target` intervals over `range`.
double nice_step(double range, int target) {
  double raw = range / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

struct Axis {
  double lo, hi, step;
};

Axis make_axis(double lo, double hi, bool pad, int target) {
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {  // a flat series still gets a span
    double d = std::max(std::fabs(hi) * 0.05, 0.5);
    lo -= d, hi += d;
  } else if (pad) {
    double d = (hi - lo) * 0.05;
    lo -= d, hi += d;
  }
  double step = nice_step(hi - lo, target);
  return {lo, hi, step};
}

}  // namespace

std::string loss_curve_svg(const std::vector<MetricsRow>& rows, const LossPlotOptions& opt) {
  const std::vector<Point> train = series(rows, "loss"), val = series(rows, "val_loss"),
                           ref = series(opt.reference, "loss");
  const double W = opt.width, H = opt.height;
  const double left = 70, right = 20, top = 44, bottom = 50;
  const double pw = W - left - right, ph = H - top - bottom;

  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool any = false;
  for (const auto* s : {&train, &val, &ref})
    for (const Point& p : *s) {
      if (!any) x0 = x1 = p.x, y0 = y1 = p.y, any = true;
      x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
    }
  const Axis ax = make_axis(x0, x1, false, 8), ay = make_axis(y0, y1, true, 6);
  auto px = [&](double x) { return left + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto py = [&](double y) { return top + (1 - (y - ay.lo) / (ay.hi - ay.lo)) * ph; };

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%g", W) +
                    "\" height=\"" + fmt("%g", H) + "\" viewBox=\"0 0 " + fmt("%g", W) + " " +
                    fmt("%g", H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + fmt("%g", W / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" +
         xml_escape(opt.title) + "</text>\n";

  // Grid lines and tick labels; ticks at multiples of the step inside the range.
  svg += "<g class=\"ticks\" stroke=\"#ddd\">\n";
  std::string labels;
  // Integer tick indices: accumulating t += step would drift off the nice values.
  for (auto i = int64_t(std::ceil(ax.lo / ax.step)); i * ax.step <= ax.hi + 1e-9 * ax.step; ++i) {
    const double t = double(i) * ax.step;
    std::string x = fmt("%.2f", px(t));
    svg += "<line x1=\"" + x + "\" y1=\"" + fmt("%.2f", top) + "\" x2=\"" + x + "\" y2=\"" +
           fmt("%.2f", top + ph) + "\"/>\n";
    labels += "<text x=\"" + x + "\" y=\"" + fmt("%.2f", top + ph + 16) +
              "\" text-anchor=\"middle\">" + fmt("%g", std::fabs(t) < 1e-12 ? 0 : t) + "</text>\n";
  }
  for (auto i = int64_t(std::ceil(ay.lo / ay.step)); i * ay.step <= ay.hi + 1e-9 * ay.step; ++i) {
    const double t = double(i) * ay.step;
    std::string y = fmt("%.2f", py(t));
    svg += "<line x1=\"" + fmt("%.2f", left) + "\" y1=\"" + y + "\" x2=\"" +
           fmt("%.2f", left + pw) + "\" y2=\"" + y + "\"/>\n";
    labels += "<text x=\"" + fmt("%.2f", left - 6) + "\" y=\"" + y +
              "\" text-anchor=\"end\" dominant-baseline=\"middle\">" +
              fmt("%g", std::fabs(t) < 1e-12 ? 0 : t) + "</text>\n";
  }
  svg += "</g>\n<g class=\"labels\">\n" + labels + "</g>\n";
  svg += "<rect class=\"axes\" x=\"" + fmt("%.2f", left) + "\" y=\"" + fmt("%.2f", top) +
         "\" width=\"" + fmt("%.2f", pw) + "\" height=\"" + fmt("%.2f", ph) +
         "\" fill=\"none\" stroke=\"black\"/>\n";
  svg += "<text x=\"" + fmt("%.2f", left + pw / 2) + "\" y=\"" + fmt("%.2f", H - 10) +
         "\" text-anchor=\"middle\">step</text>\n";
  svg += "<text transform=\"translate(16 " + fmt("%.2f", top + ph / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">loss</text>\n";

  auto polyline = [&](const std::vector<Point>& pts, const char* cls, const char* style) {
    std::string s =
        "<polyline class=\"" + std::string(cls) + "\" fill=\"none\" " + style + " points=\"";
    for (size_t i = 0; i < pts.size(); ++i)
      s += std::string(i ? " " : "") + fmt("%.2f", px(pts[i].x)) + "," + fmt("%.2f", py(pts[i].y));
    return s + "\"/>\n";
  };
  if (!ref.empty())
    svg +=
        polyline(ref, "reference", "stroke=\"#999\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"");
  svg += polyline(train, "train", "stroke=\"#1f77b4\" stroke-width=\"1.5\"");
  for (const Point& p : val)
    svg += "<circle class=\"val\" cx=\"" + fmt("%.2f", px(p.x)) + "\" cy=\"" +
           fmt("%.2f", py(p.y)) + "\" r=\"3.5\" fill=\"#d62728\"/>\n";

  // Legend, top right inside the plot.
  double lx = left + pw - 150, ly = top + 14;
  auto legend = [&](const std::string& mark, const std::string& text) {
    svg += mark + "<text x=\"" + fmt("%.2f", lx + 28) + "\" y=\"" + fmt("%.2f", ly + 4) + "\">" +
           xml_escape(text) + "</text>\n";
    ly += 18;
  };
  auto sample = [&](const char* style) {
    return "<line x1=\"" + fmt("%.2f", lx) + "\" y1=\"" + fmt("%.2f", ly) + "\" x2=\"" +
           fmt("%.2f", lx + 22) + "\" y2=\"" + fmt("%.2f", ly) + "\" " + style + "/>";
  };
  legend(sample("stroke=\"#1f77b4\" stroke-width=\"2\""), "train loss");
  if (!val.empty())
    legend("<circle cx=\"" + fmt("%.2f", lx + 11) + "\" cy=\"" + fmt("%.2f", ly) +
               "\" r=\"3.5\" fill=\"#d62728\"/>",
           "validation loss");
  if (!ref.empty())
    legend(sample("stroke=\"#999\" stroke-width=\"2\" stroke-dasharray=\"6 4\""),
           opt.reference_label);
  return svg + "</svg>\n";
}

void write_loss_curve_svg(const std::string& path, const std::vector<MetricsRow>& rows,
                          const LossPlotOptions& opt) {
  std::ofstream out(path, std::ios::trunc);
  out << loss_curve_svg(rows, opt);
  if (!out) throw IoError("loss curve '" + path + "': cannot write");
}

}  // namespace weft::core::io
