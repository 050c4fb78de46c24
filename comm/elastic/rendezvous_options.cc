// validate(): the timeout hierarchy of rendezvous_options.h, with messages naming the key.
#include "comm/elastic/rendezvous_options.h"

#include "base/check.h"
#include "base/error.h"
#include "comm/elastic/membership_record.h"

namespace weft::comm {
namespace {

std::string secs(std::chrono::milliseconds t) { return str(double(t.count()) / 1000.0, " s"); }

std::string conf(const char* key) { return str("--rdzv-conf ", key); }

void positive(std::chrono::milliseconds t, const char* key) {
  if (t.count() <= 0) throw ConfigError(conf(key), str("must be positive, got ", secs(t)));
}

// `lo` (named lo_key) must be strictly below `hi`; the error names the lower key.
void below(std::chrono::milliseconds lo, const char* lo_key, std::chrono::milliseconds hi,
           const char* hi_key) {
  if (lo < hi) return;
  throw ConfigError(conf(lo_key),
                    str(lo_key, " (", secs(lo), ") must be less than ", hi_key, " (", secs(hi),
                        "): the timeout hierarchy is "
                        "collective < step < heartbeat < join; lower ",
                        lo_key, " or raise ", hi_key));
}

}  // namespace

void validate(const RendezvousOptions& o) {
  if (o.run_id.empty()) throw ConfigError("--rdzv-id", "the run id must not be empty");
  for (unsigned char c : o.run_id)
    if (c <= ' ' || c == 0x7f)
      throw ConfigError("--rdzv-id", str("run id '", o.run_id,
                                         "' has a space or control "
                                         "character; use letters, digits, '-', '_', '.'"));
  check_node_id(o.node_id, "node id");
  if (o.min_nodes < 1 || o.max_nodes < o.min_nodes)
    throw ConfigError("--nnodes",
                      str("needs 1 <= MIN <= MAX, got ", o.min_nodes, ":", o.max_nodes));
  positive(o.heartbeat_interval, "heartbeat_interval");
  positive(o.heartbeat_timeout, "heartbeat_timeout");
  positive(o.join_timeout, "join_timeout");
  positive(o.poll_interval, "poll_interval");
  if (o.last_call.count() < 0)
    throw ConfigError(conf("last_call_timeout"),
                      str("must not be negative, got ", secs(o.last_call)));
  below(o.heartbeat_interval, "heartbeat_interval", o.heartbeat_timeout, "heartbeat_timeout");
  below(o.poll_interval, "poll_interval", o.heartbeat_timeout, "heartbeat_timeout");
  below(o.heartbeat_timeout, "heartbeat_timeout", o.join_timeout, "join_timeout");
  below(o.last_call, "last_call_timeout", o.join_timeout, "join_timeout");
  if (o.step_timeout) {
    positive(*o.step_timeout, "step_timeout");
    below(*o.step_timeout, "step_timeout", o.heartbeat_timeout, "heartbeat_timeout");
  }
  if (o.collective_timeout) {
    positive(*o.collective_timeout, "collective_timeout");
    if (o.step_timeout)
      below(*o.collective_timeout, "collective_timeout", *o.step_timeout, "step_timeout");
    else
      below(*o.collective_timeout, "collective_timeout", o.heartbeat_timeout, "heartbeat_timeout");
  }
}

}  // namespace weft::comm
