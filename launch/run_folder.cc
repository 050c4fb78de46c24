// Run folders that keep their history: resumed metrics continue, new runs go beside old ones.
#include "launch/run_folder.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "comm/communicator.h"
#include "core/io/json.h"
#include "core/tensor.h"

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

std::string format_step_line(const core::io::StepMetrics& m) {
  std::ostringstream o;
  o << std::hexfloat << m.step << ' ' << m.loss << ' ' << m.lr << ' ' << m.grad_norm << ' '
    << m.tokens_per_s << ' ' << m.world << ' ' << m.epoch << ' ' << m.data_epoch << ' '
    << m.extra.size();
  for (const auto& [key, value] : m.extra) o << ' ' << key << ' ' << value;
  return o.str();
}

core::io::StepMetrics parse_step_line(const std::string& text) {
  // std::hexfloat's output is not read back by operator>> (libstdc++): strtod reads it.
  std::istringstream in(text);
  auto number = [&]() {
    std::string w;
    if (!(in >> w)) throw InternalError("a kept step line ends early: '" + text + "'");
    char* end = nullptr;
    const double v = std::strtod(w.c_str(), &end);
    if (end != w.c_str() + w.size())
      throw InternalError("a kept step line has '" + w + "' for a number: '" + text + "'");
    return v;
  };
  core::io::StepMetrics m;
  m.step = int64_t(number());
  m.loss = number(), m.lr = number(), m.grad_norm = number(), m.tokens_per_s = number();
  m.world = int64_t(number()), m.epoch = int64_t(number()), m.data_epoch = int64_t(number());
  const int64_t n = int64_t(number());
  for (int64_t i = 0; i < n; ++i) {
    std::string key;
    if (!(in >> key)) throw InternalError("a kept step line ends early: '" + text + "'");
    m.extra.emplace_back(key, number());
  }
  return m;
}

std::optional<core::io::StepMetrics> share_agreed_line(
    comm::Communicator& world, const std::optional<core::io::StepMetrics>& mine, int64_t step) {
  const bool has = mine && mine->step == step;
  // The lowest rank that has the line (the world's size when none has).
  core::Tensor who = core::Tensor::from_vector<int64_t>({1}, {has ? world.rank() : world.size()});
  world.all_reduce(who, {.op = comm::ReduceOp::kMin}).wait();
  const int64_t from = *who.data<int64_t>();
  if (from == 0 || from == world.size()) return mine;  // the lead has it, or nobody does
  // Fixed size, so that no length travels first: a line is about 200 bytes of text.
  constexpr int64_t kBytes = 4096;
  core::Tensor buf = core::Tensor::zeros({kBytes}, core::DType::kU8);
  if (world.rank() == from) {
    const std::string text = format_step_line(*mine);
    if (int64_t(text.size()) >= kBytes)
      throw InternalError("a kept step line of " + std::to_string(text.size()) +
                          " bytes does not fit the " + std::to_string(kBytes) + " sent");
    std::memcpy(buf.raw_data(), text.data(), text.size());
  }
  world.broadcast(buf, {.root = int(from)}).wait();
  if (world.rank() != 0) return mine;
  return parse_step_line(std::string(static_cast<const char*>(buf.raw_data())));
}

}  // namespace weft::launch
