// JSONL metrics: writer (one flushed line per row) and reader for tests and tools.
#include "core/io/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "core/io/json.h"

namespace weft::core::io {
namespace fs = std::filesystem;

void MetricsRow::set(const std::string& key, double value) {
  for (auto& [k, v] : fields)
    if (k == key) {
      v = value;
      return;
    }
  fields.emplace_back(key, value);
}

std::optional<double> MetricsRow::get(const std::string& key) const {
  for (const auto& [k, v] : fields)
    if (k == key) return v;
  return std::nullopt;
}

double MetricsRow::at(const std::string& key) const {
  auto v = get(key);
  if (!v) throw IoError("metrics row has no key '" + key + "'");
  return *v;
}

std::string metrics_line(const MetricsRow& row) {
  std::string line = "{";
  for (const auto& [k, v] : row.fields)
    line += (line.size() > 1 ? ", " : "") + json_quote(k) + ": " + json_number(v);
  return line + "}";
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_)
    throw IoError("metrics file '" + path + "': cannot open for writing: " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const MetricsRow& row) {
  std::string line = metrics_line(row) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw IoError("metrics file '" + path_ + "': write failed: " + std::strerror(errno));
}

void MetricsWriter::write_step(const StepMetrics& m) {
  MetricsRow row;
  row.fields = {{"step", double(m.step)},
                {"loss", m.loss},
                {"lr", m.lr},
                {"grad_norm", m.grad_norm},
                {"tokens_per_s", m.tokens_per_s},
                {"world", double(m.world)},
                {"epoch", double(m.epoch)},
                {"data_epoch", double(m.data_epoch)}};
  for (const auto& [k, v] : m.extra) row.set(k, v);
  write(row);
}

void MetricsWriter::write_validation(int64_t step, double val_loss,
                                     const std::vector<std::pair<std::string, double>>& extra) {
  MetricsRow row;
  row.fields = {{"step", double(step)}, {"val_loss", val_loss}};
  for (const auto& [k, v] : extra) row.set(k, v);
  write(row);
}

std::vector<MetricsRow> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError("metrics file '" + path + "': cannot open for reading");
  std::vector<MetricsRow> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    JsonValue v = parse_json(line, "metrics file '" + path + "' line " + std::to_string(n));
    if (v.kind != JsonValue::Kind::kObject)
      throw IoError("metrics file '" + path + "' line " + std::to_string(n) +
                    ": expected a JSON object");
    MetricsRow row;
    for (const auto& [k, x] : v.members) {
      if (x.kind == JsonValue::Kind::kNumber)
        row.set(k, x.number);
      else if (x.kind == JsonValue::Kind::kNull)
        row.set(k, std::nan(""));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace weft::core::io
