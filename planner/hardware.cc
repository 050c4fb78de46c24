// Hardware description files: parsing with errors that name the key, writing, the compiled-in
// presets, and this machine's calibration cache (its key, path, read and write).
#include "planner/hardware.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "planner/calibration_check.h"
#include "planner/description_check.h"

namespace weft::planner {
namespace {

// configs/hardware/*.yaml, compiled in by planner/CMakeLists.txt: {name, text} pairs.
const std::vector<std::pair<std::string, std::string>>& presets() {
  static const std::vector<std::pair<std::string, std::string>> p = {
#include "hardware_presets.inc"
  };
  return p;
}

// Reads one mapping with a fixed set of keys: every key of the node must be known.
class Fields {
 public:
  Fields(const YAML::Node& node, std::string path, const std::string& source)
      : node_(node), path_(std::move(path)), source_(source) {
    if (!node_.IsMap()) fail(path_, "expected a mapping");
  }
  // Throws for keys not asked for; call after reading every field.
  void done(const std::set<std::string>& known) const {
    for (const auto& kv : node_) {
      const std::string k = kv.first.as<std::string>();
      if (!known.count(k)) {
        std::string list;
        for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
        fail(child(k), "unknown key; the keys here are " + list);
      }
    }
  }
  bool has(const std::string& k) const { return bool(node_[k]); }
  double number(const std::string& k, std::optional<double> fallback = std::nullopt,
                double lo = 0, bool lo_open = true) const {
    const YAML::Node v = node_[k];
    if (!v) {
      if (fallback) return *fallback;
      fail(child(k), "missing; give a number");
    }
    double x;
    try {
      x = v.as<double>();
    } catch (const YAML::Exception&) {
      fail(child(k), "expected a number, got '" + (v.IsScalar() ? v.Scalar() : "a collection") + "'");
    }
    if (!std::isfinite(x) || x < lo || (lo_open && x == lo))
      fail(child(k), "expected a number " + std::string(lo_open ? "> " : ">= ") + fmt(lo) +
                         ", got " + v.Scalar());
    return x;
  }
  double efficiency(const std::string& k) const {
    double e = number(k, 1.0);
    if (e > 1) fail(child(k), "an efficiency is a fraction of the peak, in (0, 1]; got " + fmt(e));
    return e;
  }
  std::string text(const std::string& k, bool required = true) const {
    const YAML::Node v = node_[k];
    if (!v) {
      if (required) fail(child(k), "missing; give a string");
      return "";
    }
    if (!v.IsScalar()) fail(child(k), "expected a string");
    return v.Scalar();
  }
  Fields sub(const std::string& k) const {
    if (!node_[k]) fail(child(k), "missing; give a mapping");
    return Fields(node_[k], child(k), source_);
  }
  const YAML::Node& node() const { return node_; }
  std::string child(const std::string& k) const { return path_ + "." + k; }
  [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
    throw ConfigError(field, msg + " (in " + source_ + ")");
  }
  static std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
  }

 private:
  YAML::Node node_;
  std::string path_;
  const std::string& source_;
};

Link read_link(const Fields& f) {
  Link l;
  l.bw = f.number("bw");
  l.latency = f.number("latency", std::nullopt, 0, false);
  l.efficiency = f.efficiency("efficiency");
  f.done({"bw", "latency", "efficiency"});
  return l;
}

// A curve of the file: a list of [x, y] points, ascending in x. `form` names the pair
// ("[FLOPs of one op, FLOP/s]"), `x_noun` what x counts for the order's message; a rate's y
// must be > 0, a wait's (`y_is_wait`) a finite number of seconds >= 0 (and its x a burst of
// seconds > 0). ConfigError naming the point.
std::vector<std::pair<double, double>> read_curve(const Fields& f, const YAML::Node& pts,
                                                  const std::string& field, const std::string& form,
                                                  const std::string& x_noun, bool y_is_wait = false) {
  std::vector<std::pair<double, double>> out;
  if (!pts.IsSequence()) f.fail(field, "expected a list of " + form);
  for (size_t i = 0; i < pts.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    double x = 0, y = 0;
    try {
      if (!pts[i].IsSequence() || pts[i].size() != 2) throw YAML::Exception(YAML::Mark(), "");
      x = pts[i][0].as<double>(), y = pts[i][1].as<double>();
    } catch (const YAML::Exception&) {
      f.fail(at, "expected " + form);
    }
    if (y_is_wait) {
      if (!(x > 0 && std::isfinite(x))) f.fail(at, "the burst must be > 0 seconds, and finite");
      if (!(y >= 0 && std::isfinite(y))) f.fail(at, "the wait must be a finite number of seconds >= 0");
    } else if (!(x > 0 && y > 0 && std::isfinite(x) && std::isfinite(y))) {
      f.fail(at, "both numbers must be > 0, and finite");
    }
    if (!out.empty() && x <= out.back().first)
      f.fail(at, "the points must be in ascending order of " + x_noun);
    out.push_back({x, y});
  }
  return out;
}

// The shortest text that reads back as the same double: a cache round-trips exactly.
std::string num(double x) {
  char b[40];
  const auto r = std::to_chars(b, b + sizeof b, x);
  return std::string(b, r.ptr);
}

std::string quoted(const std::string& s) {
  YAML::Emitter e;
  e << YAML::DoubleQuoted << s;
  return e.c_str();
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string safe(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ? c : '-';
  return out.empty() ? "unknown" : out;
}

}  // namespace

CostModel Hardware::cost_model(const std::string& dtype) const {
  if (dtype != "f32" && dtype != "bf16")
    throw ConfigError("train.dtype", "no FLOP rate for '" + dtype + "'; the hardware files give f32 and bf16");
  CostModel m;
  m.flops = (dtype == "bf16" ? flops_bf16 : flops_f32) * flops_efficiency;
  m.mem_bw = memory_bw * memory_efficiency;
  m.launch = launch;
  m.alpha_intra = intra.latency;
  m.bw_intra = intra.bw * intra.efficiency;
  m.alpha_inter = inter.latency;
  m.bw_inter = inter.bw * inter.efficiency;
  m.ranks_per_node = ranks_per_node;
  m.device_memory = int64_t(memory_gib * double(int64_t(1) << 30));
  m.cores = cores;
  m.op_overhead = op_overhead;
  m.launch_oversub = launch_oversub;
  if (dtype == "f32") m.flops_by_size = flops_by_size, m.op_rates = op_rates, m.op_rates_by_size = op_rates_by_size;
  m.coll_bw_by_size = coll_bw_by_size;
  m.sync_wait_by_burst = sync_wait_by_burst;
  m.sync_wait_oversub_by_burst = sync_wait_oversub_by_burst;
  m.sync_wait_oversub_ranks = sync_wait_oversub_ranks;
  m.sync_wait_oversub_more_by_burst = sync_wait_oversub_more_by_burst;
  m.sync_wait_oversub_more_ranks = sync_wait_oversub_more_ranks;
  return m;
}

Hardware hardware_from_yaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("hardware", "not valid YAML (" + source + "): " + e.what());
  }
  Fields f(root, "hardware", source);
  Hardware hw;
  hw.source = source;
  hw.name = f.text("name");
  {
    Fields fl = f.sub("flops");
    hw.flops_f32 = fl.number("f32");
    hw.flops_bf16 = fl.number("bf16");
    fl.done({"f32", "bf16"});
  }
  hw.flops_efficiency = f.efficiency("flops_efficiency");
  {
    Fields m = f.sub("memory");
    hw.memory_bw = m.number("bw");
    hw.memory_efficiency = m.efficiency("efficiency");
    hw.memory_gib = m.number("gib");
    m.done({"bw", "efficiency", "gib"});
  }
  const double rpn = f.number("ranks_per_node", std::nullopt, 1, false);
  if (rpn != std::floor(rpn) || rpn > double(1 << 30))
    f.fail("hardware.ranks_per_node", "expected a whole number of ranks (devices) per node");
  hw.ranks_per_node = int(rpn);
  hw.intra = read_link(f.sub("intra_node"));
  hw.inter = read_link(f.sub("inter_node"));
  hw.launch = f.number("launch", std::nullopt, 0, false);
  if (f.has("cpu")) {
    Fields c = f.sub("cpu");
    const double cores = c.number("cores", 0.0, 0, false);
    if (cores != std::floor(cores)) c.fail("hardware.cpu.cores", "expected a whole number (0: one device per rank)");
    hw.cores = int(cores);
    hw.op_overhead = c.number("op_overhead", 0.0, 0, false);
    hw.launch_oversub = c.number("launch_oversub", 0.0, 0, false);
    c.done({"cores", "op_overhead", "launch_oversub"});
  }
  if (const YAML::Node pts = root["flops_by_size"])
    hw.flops_by_size = read_curve(f, pts, "hardware.flops_by_size", "[FLOPs of one op, FLOP/s]", "FLOPs");
  // The wait curves share a form: [burst s, wait s] points, ascending in burst.
  auto wait_curve = [&](const char* key, std::vector<std::pair<double, double>>& out) {
    if (const YAML::Node pts = root[key])
      out = read_curve(f, pts, std::string("hardware.") + key,
                       "[seconds of compute before the call, seconds of wait]", "burst", true);
  };
  wait_curve("sync_wait_by_burst", hw.sync_wait_by_burst);
  wait_curve("sync_wait_oversub_by_burst", hw.sync_wait_oversub_by_burst);
  if (f.has("sync_wait_oversub_ranks")) {
    // Describes the curve above: alone, or at no more ranks than cores, it would do nothing.
    const std::string field = "hardware.sync_wait_oversub_ranks";
    const double n = f.number("sync_wait_oversub_ranks", std::nullopt, 2, false);
    if (n != std::floor(n) || n > double(1 << 30))
      f.fail(field, "expected a whole number of ranks (the processes on the node when "
                    "sync_wait_oversub_by_burst was measured)");
    if (hw.sync_wait_oversub_by_burst.empty())
      f.fail(field, "given without sync_wait_oversub_by_burst, the curve it describes; add the "
                    "curve or remove this key");
    if (n <= double(hw.cores))
      f.fail(field, "must be more than cpu.cores (" + std::to_string(hw.cores) +
                        "): the curve is measured with more ranks than cores");
    hw.sync_wait_oversub_ranks = int(n);
  }
  wait_curve("sync_wait_oversub_more_by_burst", hw.sync_wait_oversub_more_by_burst);
  {
    // The second curve and its ranks come together, above the first curve's ranks.
    const std::string field = "hardware.sync_wait_oversub_more_ranks";
    const bool curve = !hw.sync_wait_oversub_more_by_burst.empty();
    if (curve && !f.has("sync_wait_oversub_more_ranks"))
      f.fail(field, "missing: sync_wait_oversub_more_by_burst needs the ranks of the node it was "
                    "measured at (more than sync_wait_oversub_ranks)");
    if (f.has("sync_wait_oversub_more_ranks")) {
      const double n = f.number("sync_wait_oversub_more_ranks", std::nullopt, 2, false);
      if (!curve)
        f.fail(field, "given without sync_wait_oversub_more_by_burst, the curve it describes; add "
                      "the curve or remove this key");
      if (n != std::floor(n) || n > double(1 << 30))
        f.fail(field, "expected a whole number of ranks (the processes on the node when "
                      "sync_wait_oversub_more_by_burst was measured)");
      if (hw.sync_wait_oversub_ranks <= 0 || n <= double(hw.sync_wait_oversub_ranks))
        f.fail(field, "must be more than sync_wait_oversub_ranks (" +
                          std::to_string(hw.sync_wait_oversub_ranks) +
                          "), which must be given: the curve continues that one to more ranks");
      hw.sync_wait_oversub_more_ranks = int(n);
    }
  }
  if (f.has("collective_bw_by_size")) {
    Fields c = f.sub("collective_bw_by_size");
    std::set<std::string> kinds;
    for (int k = 0; k < kCollKinds; ++k) {
      const std::string kind = coll_name(CollKind(k));
      kinds.insert(kind);
      if (const YAML::Node pts = c.node()[kind])
        hw.coll_bw_by_size[size_t(k)] = read_curve(f, pts, "hardware.collective_bw_by_size." + kind,
                                                   "[bytes of one call, wire bytes/s]", "bytes");
    }
    c.done(kinds);
  }
  if (f.has("op_rates")) {
    Fields r = f.sub("op_rates");
    std::set<std::string> types(std::begin(kRatedOpTypes), std::end(kRatedOpTypes));
    for (int i = 0; i < kRatedOps; ++i) hw.op_rates[size_t(i)] = r.number(kRatedOpTypes[i], 0.0, 0, false);
    r.done(types);
  }
  if (f.has("op_rates_by_size")) {
    Fields c = f.sub("op_rates_by_size");
    std::set<std::string> types(std::begin(kRatedOpTypes), std::end(kRatedOpTypes));
    for (int k = 0; k < kRatedOps; ++k) {
      if (const YAML::Node pts = c.node()[kRatedOpTypes[k]])
        hw.op_rates_by_size[size_t(k)] =
            read_curve(f, pts, std::string("hardware.op_rates_by_size.") + kRatedOpTypes[k],
                       "[FLOPs of one op, FLOP/s]", "FLOPs");
    }
    c.done(types);
  }
  if (f.has("machine")) {
    Fields m = f.sub("machine");
    hw.machine = MachineKey{m.text("host"), m.text("cpu_model"), m.text("openblas_coretype")};
    m.done({"host", "cpu_model", "openblas_coretype"});
  }
  hw.calibrated_at = f.text("calibrated_at", false);
  if (f.has("measurements")) {
    Fields m = f.sub("measurements");
    for (const auto& kv : m.node()) {
      const std::string k = kv.first.as<std::string>();
      hw.measurements.push_back({k, m.number(k, std::nullopt, 0, false)});
    }
  }
  f.done({"name", "flops", "flops_efficiency", "memory", "ranks_per_node", "intra_node",
          "inter_node", "launch", "cpu", "flops_by_size", "collective_bw_by_size",
          "sync_wait_by_burst", "sync_wait_oversub_by_burst", "sync_wait_oversub_ranks",
          "sync_wait_oversub_more_by_burst", "sync_wait_oversub_more_ranks", "op_rates", "op_rates_by_size", "machine", "calibrated_at", "measurements"});
  return hw;
}

std::string hardware_to_yaml(const Hardware& hw) {
  std::ostringstream os;
  os << "# weft hardware description (docs/planner.md, \"Hardware descriptions\"); sustained rate =\n"
     << "# peak x efficiency.\n";
  if (hw.machine)
    os << "# Written by `weft calibrate`: measured on this machine, so every efficiency is 1.\n";
  os << "name: " << quoted(hw.name) << "\n";
  os << "flops: {f32: " << num(hw.flops_f32) << ", bf16: " << num(hw.flops_bf16) << "}\n";
  os << "flops_efficiency: " << num(hw.flops_efficiency) << "\n";
  os << "memory: {bw: " << num(hw.memory_bw) << ", efficiency: " << num(hw.memory_efficiency)
     << ", gib: " << num(hw.memory_gib) << "}\n";
  os << "ranks_per_node: " << hw.ranks_per_node << "\n";
  auto link = [&](const char* k, const Link& l) {
    os << k << ": {bw: " << num(l.bw) << ", latency: " << num(l.latency) << ", efficiency: " << num(l.efficiency)
       << "}\n";
  };
  link("intra_node", hw.intra);
  link("inter_node", hw.inter);
  os << "launch: " << num(hw.launch) << "\n";
  os << "cpu: {cores: " << hw.cores << ", op_overhead: " << num(hw.op_overhead)
     << ", launch_oversub: " << num(hw.launch_oversub) << "}\n";
  if (!hw.flops_by_size.empty()) {
    os << "flops_by_size:  # [FLOPs of one op, sustained f32 FLOP/s]\n";
    for (const auto& [x, r] : hw.flops_by_size) os << "  - [" << num(x) << ", " << num(r) << "]\n";
  }
  // Curves per kind or type: a mapping of inline [x, y] lists, the empty ones left out.
  auto curves = [&](const char* key, const char* comment, const auto& lists, auto name_of) {
    bool any = false;
    for (const auto& c : lists) any = any || !c.empty();
    if (!any) return;
    os << key << ":  # " << comment << "\n";
    for (size_t k = 0; k < lists.size(); ++k) {
      const auto& c = lists[k];
      if (c.empty()) continue;
      os << "  " << name_of(int(k)) << ": [";
      for (size_t i = 0; i < c.size(); ++i) os << (i ? ", [" : "[") << num(c[i].first) << ", " << num(c[i].second) << "]";
      os << "]\n";
    }
  };
  curves("collective_bw_by_size", "per kind: [bytes of one call, wire bytes/s], measured at 2 ranks",
         hw.coll_bw_by_size, [](int k) { return coll_name(CollKind(k)); });
  if (!hw.sync_wait_by_burst.empty()) {
    os << "sync_wait_by_burst:  # [seconds of compute before a collective, its mean wait beyond "
          "its price], at 2 ranks\n";
    for (const auto& [x, w] : hw.sync_wait_by_burst)
      os << "  - [" << num(x) << ", " << num(w) << "]\n";
  }
  if (!hw.sync_wait_oversub_by_burst.empty()) {
    os << "sync_wait_oversub_by_burst:  # the same with more ranks than cores (replaces "
          "launch_oversub there), beyond its price without launch_oversub\n";
    for (const auto& [x, w] : hw.sync_wait_oversub_by_burst)
      os << "  - [" << num(x) << ", " << num(w) << "]\n";
    if (hw.sync_wait_oversub_ranks > 0)
      os << "sync_wait_oversub_ranks: " << hw.sync_wait_oversub_ranks
         << "  # ranks of the node in that probe, every one runnable\n";
  }
  if (!hw.sync_wait_oversub_more_by_burst.empty()) {
    os << "sync_wait_oversub_more_by_burst:  # the same at more ranks of the node\n";
    for (const auto& [x, w] : hw.sync_wait_oversub_more_by_burst)
      os << "  - [" << num(x) << ", " << num(w) << "]\n";
    os << "sync_wait_oversub_more_ranks: " << hw.sync_wait_oversub_more_ranks
       << "  # ranks of the node in that probe, every one runnable\n";
  }
  bool any_op = false;
  for (double r : hw.op_rates) any_op = any_op || r > 0;
  if (any_op) {
    os << "op_rates:  # measured f32 rate of each kernel, in the cost model's FLOPs of that op per second\n";
    for (int i = 0; i < kRatedOps; ++i)
      if (hw.op_rates[size_t(i)] > 0) os << "  " << kRatedOpTypes[i] << ": " << num(hw.op_rates[size_t(i)]) << "\n";
  }
  curves("op_rates_by_size", "per type: [FLOPs of one op, FLOP/s], at each shape it was timed",
         hw.op_rates_by_size, [](int k) { return std::string(kRatedOpTypes[k]); });
  if (hw.machine)
    os << "machine: {host: " << quoted(hw.machine->host) << ", cpu_model: " << quoted(hw.machine->cpu_model)
       << ", openblas_coretype: " << quoted(hw.machine->openblas_coretype) << "}\n";
  if (!hw.calibrated_at.empty()) os << "calibrated_at: " << quoted(hw.calibrated_at) << "\n";
  if (!hw.measurements.empty()) {
    os << "measurements:  # what was measured (seconds, or bytes/s and FLOP/s), for the record\n";
    for (const auto& [k, v] : hw.measurements) os << "  " << k << ": " << num(v) << "\n";
  }
  return os.str();
}

std::vector<std::string> hardware_presets() {
  std::vector<std::string> names;
  for (const auto& [n, t] : presets()) names.push_back(n);
  return names;
}

namespace {

// A description whose model contradicts itself (description_check.h) is refused where it is
// loaded by name: ConfigError naming the key, the numbers, the fix and the file.
Hardware consistent(Hardware hw) {
  const std::vector<DescriptionContradiction> bad = check_description(hw);
  if (!bad.empty())
    throw ConfigError(
        bad.front().field,
        bad.front().text +
            (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more)" : "") + " (in " +
            hw.source + ")");
  return hw;
}

}  // namespace

Hardware load_hardware(const std::string& name_or_path, const std::string& field) {
  for (const auto& [n, text] : presets())
    if (n == name_or_path) return consistent(hardware_from_yaml(text, "preset " + n));
  std::ifstream in(name_or_path);
  if (!in) {
    std::string list;
    for (const std::string& n : hardware_presets()) list += (list.empty() ? "" : ", ") + n;
    throw ConfigError(field, "'" + name_or_path + "' is neither a preset (" + list +
                                 ") nor a readable hardware file; give a preset name or a file path "
                                 "(format: docs/planner.md, \"Hardware descriptions\")");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return consistent(hardware_from_yaml(ss.str(), name_or_path));
}

MachineKey this_machine() {
  MachineKey k;
  k.host = host_name();
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      k.cpu_model = c == std::string::npos ? "" : line.substr(line.find_first_not_of(' ', c + 1));
      break;
    }
  if (k.cpu_model.empty()) k.cpu_model = "unknown";
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  k.openblas_coretype = ct && *ct ? ct : "auto";
  return k;
}

std::string machine_id(const MachineKey& k) {
  char h[16];
  std::snprintf(h, sizeof h, "%08x", unsigned(fnv1a(k.cpu_model) & 0xffffffffu));
  return safe(k.host) + "-" + h + "-" + safe(k.openblas_coretype);
}

std::string machine_cache_path(const MachineKey& k) {
  if (const char* f = std::getenv("WEFT_COST_CACHE"); f && *f) return f;
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = std::string(h) + "/.cache";
  else
    dir = "/tmp";
  return dir + "/weft/cost-" + machine_id(k) + ".yaml";
}

void write_machine_cache(const Hardware& hw, const std::string& path) {
  if (!hw.machine) throw InternalError("write_machine_cache: the description names no machine");
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << hardware_to_yaml(hw);
    if (!out.flush()) throw IoError("cannot write " + tmp);
  }
  fs::rename(tmp, p, ec);
  if (ec) throw IoError("cannot move " + tmp + " to " + path + ": " + ec.message());
}

std::optional<Hardware> read_machine_cache(const std::string& path, const MachineKey& k, std::string* why) {
  std::ifstream in(path);
  if (!in) {
    if (why) *why = "no calibration at " + path + " (run `weft calibrate`)";
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  Hardware hw = hardware_from_yaml(ss.str(), path);
  if (!hw.machine) {
    if (why) *why = path + " names no machine (not a calibration cache)";
    return std::nullopt;
  }
  if (!(*hw.machine == k)) {
    if (why)
      *why = path + " was measured on " + machine_id(*hw.machine) + ", not this machine (" + machine_id(k) +
             "); run `weft calibrate`";
    return std::nullopt;
  }
  // A cache whose collectives contradict themselves (written before `weft calibrate` checked
  // them) would mislead every plan: not used, and said so on stderr as well as in `why`.
  const std::vector<CollectiveContradiction> bad =
      check_collectives(recorded_collective_times(hw), hw.cores);
  if (!bad.empty()) {
    const std::string text =
        path + " is not used: its measured collectives contradict themselves (" + bad.front().text +
        (bad.size() > 1 ? "; and " + std::to_string(bad.size() - 1) + " more" : "") +
        "); run `weft calibrate` again";
    WEFT_WARN("planner", text);
    if (why) *why = "warning: " + text;
    return std::nullopt;
  }
  // So would one whose model does (a cache written before `weft calibrate` checked it, or
  // edited by hand): the same refusal.
  const std::vector<DescriptionContradiction> priced = check_description(hw);
  if (!priced.empty()) {
    const std::string text = path + " is not used: its model contradicts itself (" +
                             describe(priced) + "); run `weft calibrate` again";
    WEFT_WARN("planner", text);
    if (why) *why = "warning: " + text;
    return std::nullopt;
  }
  return hw;
}

CostModel choose_cost_model(const std::string& choice, const std::string& dtype, std::string* used) {
  if (!choice.empty()) {
    Hardware hw = load_hardware(choice);
    if (used) *used = "hardware " + hw.source + " (" + hw.name + "), " + dtype + " rates";
    return hw.cost_model(dtype);
  }
  std::string why;
  const std::string path = machine_cache_path();
  if (std::optional<Hardware> hw = read_machine_cache(path, this_machine(), &why)) {
    if (used) *used = "this machine's calibration " + path + " (" + hw->calibrated_at + "), " + dtype + " rates";
    return hw->cost_model(dtype);
  }
  if (used) *used = "built-in defaults, a rough H100 node (" + why + "; or give --hardware h100|h200|FILE)";
  return CostModel{};
}

}  // namespace weft::planner
