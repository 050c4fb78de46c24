// Per-rank error files: written by a failing worker, read by `weft run`'s root-cause summary.
#include "launch/error_file.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/host.h"
#include "core/io/json.h"

namespace weft::launch {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string format_time_ms(int64_t ms) {
  std::time_t s = std::time_t(ms / 1000);
  std::tm tm{};
  ::localtime_r(&s, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03lld", (long long)(ms % 1000));
  return buf;
}

void record_error(const std::exception& e) noexcept {
  try {
    const char* path = std::getenv(kErrorFileVar);
    if (!path || !*path) return;
    if (std::ifstream(path).good()) return;  // the first failure stays
    std::string kind = "error";
    if (dynamic_cast<const PeerLostError*>(&e)) kind = "peer_lost";
    else if (dynamic_cast<const TimeoutError*>(&e)) kind = "timeout";
    else if (dynamic_cast<const ConfigError*>(&e)) kind = "config";
    const std::string host = host_name();
    const char* rank = std::getenv("RANK");
    int64_t ms = now_ms();
    using core::io::json_quote;
    std::ostringstream o;
    o << "{\"message\": {\"message\": " << json_quote(e.what())
      << ", \"extraInfo\": {\"timestamp\": \"" << ms / 1000 << "\", \"timestamp_ms\": " << ms
      << ", \"kind\": " << json_quote(kind) << ", \"rank\": " << (rank ? std::atoi(rank) : -1)
      << ", \"pid\": " << ::getpid() << ", \"host\": " << json_quote(host) << "}}}\n";
    std::string tmp = std::string(path) + ".tmp";
    std::ofstream(tmp) << o.str();
    std::rename(tmp.c_str(), path);
  } catch (...) {
  }
}

std::optional<ErrorRecord> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    core::io::JsonValue doc = core::io::parse_json(text, path);
    const core::io::JsonValue* m = doc.find("message");
    if (!m) return std::nullopt;
    ErrorRecord r;
    const core::io::JsonValue* info = nullptr;
    if (m->kind == core::io::JsonValue::Kind::kString) {
      r.message = m->text;
    } else {
      if (const auto* t = m->find("message")) r.message = t->text;
      info = m->find("extraInfo");
    }
    if (info) {
      int64_t v = 0;
      if (const auto* t = info->find("timestamp_ms"); t && t->as_int64(v)) r.time_ms = v;
      else if (const auto* s = info->find("timestamp")) r.time_ms = std::atoll(s->text.c_str()) * 1000;
      if (const auto* t = info->find("kind")) r.kind = t->text;
      if (const auto* t = info->find("rank"); t && t->as_int64(v)) r.rank = int(v);
      if (const auto* t = info->find("pid"); t && t->as_int64(v)) r.pid = int(v);
      if (const auto* t = info->find("host")) r.host = t->text;
    }
    if (r.kind.empty()) r.kind = "error";
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace weft::launch
