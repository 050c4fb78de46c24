// An SVG loss curve from metrics rows: the picture a run folder carries so that a run
// can be judged without a plotting stack. Plain string building, no dependency.
#pragma once

#include <string>
#include <vector>

#include "core/io/metrics.h"

namespace weft::core::io {

struct LossPlotOptions {
  std::string title = "training loss";
  int width = 800, height = 480;
  // Optional second curve (e.g. shared/reference's expected.jsonl), drawn dashed.
  std::vector<MetricsRow> reference;
  std::string reference_label = "reference";
};

// Training loss as one <polyline class="train"> with a point per step row (rows with
// "step" and "loss"; NaN or infinite losses are left out), validation rows ("val_loss")
// as <circle class="val">, axes with tick labels, a legend and the title.
std::string loss_curve_svg(const std::vector<MetricsRow>& rows, const LossPlotOptions& opt = {});

// Writes loss_curve_svg(...) to `path`; throws IoError when it cannot.
void write_loss_curve_svg(const std::string& path, const std::vector<MetricsRow>& rows,
                          const LossPlotOptions& opt = {});

}  // namespace weft::core::io
