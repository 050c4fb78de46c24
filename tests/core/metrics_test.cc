// Metrics JSONL (writer, reader, flushing, NaN) and the SVG loss curve.
#include "core/io/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "base/error.h"
#include "core/io/loss_plot.h"

namespace weft::core::io {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d =
      fs::temp_directory_path() / ("weft_metrics_test_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  return d;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Metrics, WritesFlushedLinesAndReadsThemBack) {
  fs::path dir = temp_dir();
  const std::string p = (dir / "sub" / "metrics.jsonl").string();  // parent is created
  {
    MetricsWriter w(p);
    w.write_step({0, 5.61, 3e-4, 1.9, 12345.6, 4, 2, 1, {{"aux_loss", 0.25}}});
    w.write_step({1, 5.5, 6e-4, 1.7, 12000, 4, 0, 0, {}});
    w.write_validation(1, 5.4);
    // Readable before the writer closes: each line is flushed.
    auto rows = read_metrics(p);
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].fields[0].first, "step");
    EXPECT_EQ(rows[0].fields[1].first, "loss");
    EXPECT_DOUBLE_EQ(rows[0].at("tokens_per_s"), 12345.6);
    EXPECT_EQ(rows[0].at("lr"), 3e-4);  // exact: shortest round-trip text
    EXPECT_EQ(rows[0].at("aux_loss"), 0.25);
    EXPECT_EQ(rows[1].at("world"), 4);
    EXPECT_EQ(rows[0].at("epoch"), 2);       // weft run's membership epoch
    EXPECT_EQ(rows[0].at("data_epoch"), 1);  // passes over the data
    EXPECT_FALSE(rows[1].has("aux_loss"));
    EXPECT_TRUE(rows[2].is_validation());
    EXPECT_EQ(rows[2].at("val_loss"), 5.4);
    EXPECT_THROW(rows[2].at("loss"), IoError);
  }
  std::ifstream in(p);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first,
            "{\"step\": 0, \"loss\": 5.61, \"lr\": 3e-04, \"grad_norm\": 1.9, \"tokens_per_s\": "
            "12345.6, \"world\": 4, \"epoch\": 2, \"data_epoch\": 1, \"aux_loss\": 0.25}");
  {
    MetricsWriter again(p, /*append=*/true);
    again.write_step({2, std::nan(""), 1e-3, INFINITY, 0, 4, 1, {}});
  }
  auto rows = read_metrics(p);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_TRUE(std::isnan(rows[3].at("loss")));  // written as null: JSON has no NaN
  EXPECT_TRUE(std::isnan(rows[3].at("grad_norm")));
  fs::remove_all(dir);
}

TEST(Metrics, ReaderNamesBadLines) {
  fs::path dir = temp_dir();
  fs::create_directories(dir);
  std::ofstream(dir / "m.jsonl")
      << "{\"step\": 0, \"loss\": 1, \"name\": \"x\"}\n\n{\"step\": 1,\n";
  try {
    read_metrics((dir / "m.jsonl").string());
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_metrics((dir / "none.jsonl").string()), IoError);
  fs::remove_all(dir);
}

TEST(Metrics, ReadsTheReferenceExpectedFile) {
  auto rows = read_metrics(std::string(WEFT_REFERENCE_DIR) + "/gpt-tiny/expected.jsonl");
  ASSERT_EQ(rows.size(), 20u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].at("step"), double(i));
  EXPECT_EQ(rows[0].at("lr"), 0.0015);
}

TEST(LossPlot, OnePolylinePointPerStepAndValidationMarkers) {
  std::vector<MetricsRow> rows;
  for (int s = 0; s < 12; ++s) {
    MetricsRow r;
    r.fields = {{"step", double(s)}, {"loss", 5.5 - 0.2 * s}, {"lr", 1e-3}};
    rows.push_back(r);
    if (s % 5 == 4) {
      MetricsRow v;
      v.fields = {{"step", double(s)}, {"val_loss", 5.0 - 0.1 * s}};
      rows.push_back(v);
    }
  }
  LossPlotOptions opt;
  opt.title = "gpt-small <fortunes> & co";
  std::string svg = loss_curve_svg(rows, opt);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(svg, m, std::regex("<polyline class=\"train\"[^>]* points=\"([^\"]*)\"")));
  std::string pts = m[1];
  EXPECT_EQ(count(pts, ","), 12u);
  EXPECT_EQ(count(pts, " ") + 1, 12u);
  // x grows with the step; y falls as the loss falls (SVG y points down).
  float x0, y0, x1, y1;
  ASSERT_EQ(std::sscanf(pts.c_str(), "%f,%f %f,%f", &x0, &y0, &x1, &y1), 4);
  EXPECT_GT(x1, x0);
  EXPECT_GT(y1, y0);
  EXPECT_EQ(count(svg, "<circle class=\"val\""), 2u);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_NE(svg.find("gpt-small &lt;fortunes&gt; &amp; co"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">10</text>"), std::string::npos);  // an x tick label
  EXPECT_NE(svg.find(">5</text>"), std::string::npos);   // a y tick label
  EXPECT_GE(count(svg, "text-anchor=\"end\""), 3u);      // several y ticks

  opt.reference = rows;  // a dashed second curve
  svg = loss_curve_svg(rows, opt);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_NE(svg.find("class=\"reference\""), std::string::npos);

  fs::path dir = temp_dir();
  fs::create_directories(dir);
  write_loss_curve_svg((dir / "loss.svg").string(), rows);
  EXPECT_GT(fs::file_size(dir / "loss.svg"), 500u);
  fs::remove_all(dir);
}

TEST(LossPlot, SinglePointAndEmptyInputsStillDraw) {
  MetricsRow r;
  r.fields = {{"step", 0}, {"loss", 3.0}};
  // No coordinate or label may be NaN or infinite (a zero-width axis would give them).
  auto numbers_finite = [](std::string svg) {
    svg = std::regex_replace(svg, std::regex("dominant-baseline"), "");
    return svg.find("nan") == std::string::npos && svg.find("inf") == std::string::npos;
  };
  std::string svg = loss_curve_svg({r});
  EXPECT_NE(svg.find("points=\""), std::string::npos);
  EXPECT_TRUE(numbers_finite(svg)) << svg;
  svg = loss_curve_svg({});
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_TRUE(numbers_finite(svg)) << svg;
}

}  // namespace
}  // namespace weft::core::io
