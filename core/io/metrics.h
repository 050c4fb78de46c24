// The metrics file (ARCHITECTURE.md, "Metrics"): one JSON object per line, flushed per
// line so a crashed or killed run keeps every step it finished. Rank 0 writes it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace weft::core::io {

// One line: numeric fields in the order written (step first). JSON null reads as NaN.
struct MetricsRow {
  std::vector<std::pair<std::string, double>> fields;

  void set(const std::string& key, double value);  // replaces or appends
  bool has(const std::string& key) const { return get(key).has_value(); }
  std::optional<double> get(const std::string& key) const;
  double at(const std::string& key) const;  // throws IoError when absent
  bool is_validation() const { return has("val_loss"); }
};

// What the trainer reports for one optimizer step.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  // world: ranks in the step; epoch: weft run's membership epoch (0 outside an elastic
  // job); data_epoch: complete passes over the training data before the step.
  int64_t world = 1, epoch = 0, data_epoch = 0;
  std::vector<std::pair<std::string, double>> extra;  // aux_loss, step_ms, ... after the rest
};

class MetricsWriter {
 public:
  // Creates the parent folder if needed; truncates unless `append` (a resumed run keeps
  // its earlier lines). Throws IoError when the file cannot be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // {"step": 0, "loss": ..., "lr": ..., "grad_norm": ..., "tokens_per_s": ..., "world": ...,
  //  "epoch": ..., "data_epoch": ..., extra...}
  void write_step(const StepMetrics& m);
  // {"step": s, "val_loss": v, extra...}
  void write_validation(int64_t step, double val_loss,
                        const std::vector<std::pair<std::string, double>>& extra = {});
  // Any row, keys in its order. Each write is one line, flushed; throws IoError on failure.
  void write(const MetricsRow& row);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Reads a metrics file; non-numeric values are skipped. Throws IoError naming the path
// and line for a missing file or a line that is not a JSON object.
std::vector<MetricsRow> read_metrics(const std::string& path);

// One row as its JSON line (without the newline).
std::string metrics_line(const MetricsRow& row);

}  // namespace weft::core::io
