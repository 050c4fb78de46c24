// Run folders that keep their history: resumed metrics continue, new runs go beside old ones.
#include "launch/run_folder.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "core/io/json.h"

namespace weft::launch {
namespace {
namespace fs = std::filesystem;

// The non-blank lines of a metrics file (none when it does not exist).
std::vector<std::string> metrics_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::error_code ec;
  if (!fs::exists(path, ec)) return lines;
  std::ifstream in(path);
  if (!in) throw IoError("metrics file '" + path + "': cannot open for reading");
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  return lines;
}

// The step of a metrics line, or nullopt for a line that is not a JSON object with an integer
// step (the torn last line of a killed run).
std::optional<int64_t> line_step(const std::string& line) {
  try {
    core::io::JsonValue v = core::io::parse_json(line, "metrics line");
    const core::io::JsonValue* s = v.find("step");
    int64_t step = 0;
    if (s && s->as_int64(step)) return step;
  } catch (const IoError&) {
  }
  return std::nullopt;
}

}  // namespace

RunFolder choose_run_folder(const std::string& out_dir, const std::string& metrics_flag,
                            std::optional<int64_t> resume_step) {
  RunFolder f;
  f.out = out_dir;
  auto metrics_in = [&](const std::string& out) {
    return metrics_flag.empty() ? (fs::path(out) / "metrics.jsonl").string() : metrics_flag;
  };
  f.metrics_path = metrics_in(f.out);
  if (resume_step) return f;
  size_t earlier = metrics_lines(f.metrics_path).size();
  if (earlier == 0) return f;
  if (!metrics_flag.empty()) {
    f.note = "metrics: replacing " + metrics_flag + " (" + std::to_string(earlier) +
             " lines of an earlier run; --resume continues a run instead)";
    return f;
  }
  for (int n = 2;; ++n) {
    std::string sibling = out_dir + "-" + std::to_string(n);
    if (metrics_lines(metrics_in(sibling)).empty()) {
      f.note = "run folder: " + out_dir + " holds an earlier run (" + std::to_string(earlier) +
               " metrics lines); this run writes " + sibling +
               " (set train.out_dir to choose, or --resume to continue that run)";
      f.out = sibling;
      f.metrics_path = metrics_in(sibling);
      return f;
    }
  }
}

std::unique_ptr<core::io::MetricsWriter> open_metrics(const RunFolder& folder,
                                                      std::optional<int64_t> resume_step) {
  const std::string& path = folder.metrics_path;
  if (!resume_step) return std::make_unique<core::io::MetricsWriter>(path);
  std::vector<std::string> kept;
  for (const std::string& line : metrics_lines(path)) {
    std::optional<int64_t> s = line_step(line);
    if (s && *s < *resume_step) kept.push_back(line);
  }
  // Write the kept lines beside the file and rename it over: a crash here leaves the old
  // history or the new one, never a half-written file.
  std::string tmp = path + ".tmp";
  {
    std::error_code ec;
    fs::path parent = fs::path(path).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& line : kept) out << line << '\n';
    out.flush();
    if (!out) throw IoError("metrics file '" + tmp + "': write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IoError("metrics file '" + path + "': cannot replace: " + ec.message());
  return std::make_unique<core::io::MetricsWriter>(path, /*append=*/true);
}

bool append_agreed_line(core::io::MetricsWriter& w, const core::io::StepMetrics& line,
                        int64_t resume_step) {
  if (line.step + 1 != resume_step) return false;
  for (const std::string& l : metrics_lines(w.path()))
    if (line_step(l) == line.step && l.find("\"val_loss\"") == std::string::npos) return false;
  w.write_step(line);
  return true;
}

}  // namespace weft::launch
