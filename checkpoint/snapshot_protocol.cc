// The worker/agent line protocol: JSON forms and the synchronous client with a timeout on
// every call (Asio on a private io_context, run only inside a call).
#include "checkpoint/snapshot_protocol.h"

#include <sys/un.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <istream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "base/env.h"
#include "base/error.h"

namespace weft::checkpoint {

namespace asio = boost::asio;
using json = nlohmann::json;
using Local = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

namespace {

template <typename T>
T field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key))
    throw std::invalid_argument(std::string("missing \"") + key + "\"");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw std::invalid_argument(std::string("\"") + key + "\" has the wrong type");
  }
}

const char* kind_text(SegmentKind k) {
  switch (k) {
    case SegmentKind::kData:
      return "data";
    case SegmentKind::kReplica:
      return "replica";
    case SegmentKind::kParity:
      return "parity";
    case SegmentKind::kRebuilt:
      return "rebuilt";
  }
  return "?";
}

SegmentKind kind_of(const std::string& s) {
  if (s == "data") return SegmentKind::kData;
  if (s == "replica") return SegmentKind::kReplica;
  if (s == "parity") return SegmentKind::kParity;
  if (s == "rebuilt") return SegmentKind::kRebuilt;
  throw std::invalid_argument("\"kind\" is not data, replica, parity or rebuilt: " + s);
}

}  // namespace

json to_json(const Reservation& r) {
  json ranks = json::array();
  for (const RankSlot& s : r.ranks)
    ranks.push_back({{"rank", s.rank}, {"world", s.world}, {"bytes", s.bytes}});
  return {{"op", "reserve"},       {"job", r.job},   {"node", r.node},
          {"epoch", r.epoch},      {"ranks", ranks}, {"parity_bytes", r.parity_bytes},
          {"allocate", r.allocate}};
}

Reservation reservation_from_json(const json& j) {
  Reservation r;
  r.job = field<std::string>(j, "job");
  r.node = field<int>(j, "node");
  r.epoch = field<int64_t>(j, "epoch");
  r.parity_bytes = j.contains("parity_bytes") ? field<int64_t>(j, "parity_bytes") : 0;
  r.allocate = j.contains("allocate") ? field<bool>(j, "allocate") : true;
  const json ranks = field<json>(j, "ranks");
  if (!ranks.is_array()) throw std::invalid_argument("\"ranks\" is not an array");
  for (const json& x : ranks)
    r.ranks.push_back({field<int>(x, "rank"), field<int>(x, "world"), field<int64_t>(x, "bytes")});
  return r;
}

json to_json(const SnapshotMeta& m) {
  char hash[24];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, m.layout_hash);
  return {{"job", m.job_id},
          {"kind", kind_text(m.kind)},
          {"node", m.owner_node},
          {"epoch", m.epoch},
          {"step", m.step},
          {"rank", m.rank},
          {"world", m.world},
          {"layout_hash", hash},
          {"payload_bytes", m.payload_bytes},
          {"sequence", m.sequence}};
}

SnapshotMeta meta_from_json(const json& j) {
  SnapshotMeta m;
  m.job_id = field<std::string>(j, "job");
  m.kind = kind_of(field<std::string>(j, "kind"));
  m.owner_node = field<int>(j, "node");
  m.epoch = field<int64_t>(j, "epoch");
  m.step = field<int64_t>(j, "step");
  m.rank = field<int>(j, "rank");
  m.world = field<int>(j, "world");
  m.layout_hash = std::stoull(field<std::string>(j, "layout_hash"), nullptr, 16);
  m.payload_bytes = field<int64_t>(j, "payload_bytes");
  m.sequence = field<int64_t>(j, "sequence");
  return m;
}

json to_json(const SegmentInfo& s) {
  json j = {{"name", s.name},
            {"epoch", s.epoch},
            {"rank", s.rank},
            {"capacity", s.capacity},
            {"owner_pid", s.owner_pid}};
  if (s.committed) j["committed"] = to_json(*s.committed);
  return j;
}

SegmentInfo segment_info_from_json(const json& j) {
  SegmentInfo s;
  s.name = field<std::string>(j, "name");
  s.epoch = field<int64_t>(j, "epoch");
  s.rank = field<int>(j, "rank");
  s.capacity = field<int64_t>(j, "capacity");
  s.owner_pid = field<int>(j, "owner_pid");
  if (j.contains("committed")) s.committed = meta_from_json(j.at("committed"));
  return s;
}

std::chrono::milliseconds default_snapshot_call_timeout() {
  return std::chrono::milliseconds(env_int("WEFT_SNAPSHOT_TIMEOUT_MS", 10000));
}

// ---- the client ------------------------------------------------------------------------

struct SnapshotAgentClient::Io {
  asio::io_context io;
  Local::socket sock{io};
  asio::streambuf in{kSnapshotMaxLineBytes};

  void close() {
    boost::system::error_code ignored;
    sock.close(ignored);
    in.consume(in.size());
  }
  // Runs the posted operations until `done` or the deadline; on the deadline the socket
  // is closed (which cancels them) and false is returned.
  bool run_until(const bool& done, Clock::time_point deadline) {
    io.restart();
    while (!done && Clock::now() < deadline && !io.stopped()) io.run_until(deadline);
    if (done) return true;
    close();
    io.restart();
    io.run();  // the cancelled handlers complete now
    return false;
  }
};

SnapshotAgentClient::SnapshotAgentClient(std::chrono::milliseconds timeout,
                                         std::chrono::milliseconds reserve_timeout)
    : io_(std::make_unique<Io>()), timeout_(timeout), reserve_timeout_(reserve_timeout) {}

SnapshotAgentClient::~SnapshotAgentClient() = default;

void SnapshotAgentClient::connect(const std::string& path) {
  constexpr size_t kMax = sizeof(sockaddr_un{}.sun_path) - 1;
  if (path.empty() || path.size() > kMax)
    throw IoError("snapshot agent: '" + path + "' cannot be a Unix socket path (empty, or " +
                  std::to_string(path.size()) + " bytes: at most " + std::to_string(kMax) + ")");
  path_ = path;
  connect_by(Clock::now() + timeout_);
}

void SnapshotAgentClient::connect_by(std::chrono::steady_clock::time_point deadline) {
  const std::string& path = path_;
  io_->close();
  std::string last = "nothing tried";
  for (;;) {
    bool done = false;
    boost::system::error_code ec;
    io_->sock.async_connect(Local::endpoint(path), [&](boost::system::error_code e) {
      ec = e;
      done = true;
    });
    if (!io_->run_until(done, deadline)) {
      last = "the connection was not accepted";
      break;
    }
    if (!ec) return;
    last = ec.message();
    io_->close();
    // Nothing listens yet (an agent starting or restarted): try again until the deadline.
    const bool absent = ec == asio::error::not_found || ec == asio::error::connection_refused ||
                        ec.value() == ENOENT || ec.value() == ECONNREFUSED;
    if (!absent || Clock::now() + std::chrono::milliseconds(20) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw IoError("snapshot agent at " + path + ": cannot connect in time (" + last +
                "); is `weft snapshot-agent` running for this job and node?");
}

json SnapshotAgentClient::call(const json& request, std::chrono::milliseconds timeout) {
  if (path_.empty()) throw IoError("snapshot agent: call before connect()");
  const std::string op = request.value("op", std::string("?"));
  const auto deadline = Clock::now() + timeout;
  const std::string line = request.dump() + "\n";
  // A connection kept from an earlier call may lead to an agent that has since exited (and
  // been restarted): its failure is retried once on a fresh connection. Every request is
  // idempotent, so a request the old agent did act on may be sent again.
  for (bool reused = io_->sock.is_open();; reused = false) {
    if (!io_->sock.is_open()) connect_by(deadline);
    bool done = false;
    boost::system::error_code ec;
    asio::async_write(io_->sock, asio::buffer(line), [&](boost::system::error_code e, size_t) {
      if (e) {
        ec = e;
        done = true;
        return;
      }
      asio::async_read_until(io_->sock, io_->in, '\n', [&](boost::system::error_code e2, size_t) {
        ec = e2;
        done = true;
      });
    });
    if (!io_->run_until(done, deadline))
      throw IoError("snapshot agent at " + path_ + " did not answer '" + op + "' within " +
                    std::to_string(timeout.count()) +
                    " ms (hung or stopped); the call is abandoned");
    if (!ec) break;
    io_->close();
    if (reused && Clock::now() < deadline) continue;
    throw IoError("snapshot agent at " + path_ + ": '" + op + "' failed: " + ec.message() +
                  " (the agent exited or closed the connection)");
  }
  std::istream is(&io_->in);
  std::string reply;
  std::getline(is, reply);
  try {
    json j = json::parse(reply);
    if (!j.is_object() || !j.contains("ok")) throw std::invalid_argument("no \"ok\"");
    return j;
  } catch (const std::exception& e) {
    io_->close();
    throw IoError("snapshot agent at " + path_ + ": a reply to '" + op +
                  "' that is not the protocol's (" + e.what() + "): " + reply.substr(0, 200));
  }
}

json SnapshotAgentClient::checked(const json& request, std::chrono::milliseconds timeout) {
  json reply = call(request, timeout);
  if (reply.value("ok", false)) return reply;
  const std::string error = reply.value("error", std::string("(no message)"));
  if (reply.contains("field") && reply["field"].is_string())
    throw ConfigError(reply["field"].get<std::string>(), error);
  throw IoError("snapshot agent at " + path_ + " refused '" +
                request.value("op", std::string("?")) + "': " + error);
}

std::vector<std::string> SnapshotAgentClient::segment(const Reservation& r) {
  json reply = checked(to_json(r), std::max(timeout_, reserve_timeout_));
  try {
    return reply.at("segments").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw IoError("snapshot agent at " + path_ +
                  ": a reserve reply without its segments: " + e.what());
  }
}

int64_t SnapshotAgentClient::committed(const std::string& name, int64_t step) {
  json reply = checked({{"op", "committed"}, {"name", name}, {"step", step}}, timeout_);
  return reply.value("step", int64_t(-1));
}

bool SnapshotAgentClient::idle() {
  const json reply = checked({{"op", "idle"}}, timeout_);
  if (!reply.contains("idle") || !reply["idle"].is_boolean())
    throw IoError(path_ + ": the agent's idle reply has no \"idle\" (an older agent?)");
  return reply["idle"].get<bool>();
}

std::vector<SegmentInfo> SnapshotAgentClient::list(std::optional<int64_t> epoch) {
  json request = {{"op", "list"}};
  if (epoch) request["epoch"] = *epoch;
  // A new world's list may wait for the agent to rebuild lost snapshots from parity.
  json reply = checked(request, epoch ? std::max(timeout_, kListWaitTimeout) : timeout_);
  std::vector<SegmentInfo> out;
  try {
    for (const json& s : reply.at("segments")) out.push_back(segment_info_from_json(s));
  } catch (const std::exception& e) {
    throw IoError("snapshot agent at " + path_ +
                  ": a list reply that is not the protocol's: " + e.what());
  }
  return out;
}

int64_t SnapshotAgentClient::repair(const std::string& segment, int64_t step) {
  const json reply = checked({{"op", "repair"}, {"segment", segment}, {"step", step}},
                             std::max(timeout_, kRepairTimeout));
  return reply.value("repaired", int64_t(0));
}

std::string SnapshotAgentClient::endpoint() {
  json reply = checked({{"op", "endpoint"}}, timeout_);
  const json e = reply.value("endpoint", json());
  return e.is_string() ? e.get<std::string>() : std::string();
}

std::string SnapshotAgentClient::peers(const std::string& job, int64_t epoch, int node,
                                       const std::vector<std::string>& nodes) {
  json reply =
      checked({{"op", "peers"}, {"job", job}, {"epoch", epoch}, {"node", node}, {"nodes", nodes}},
              timeout_);
  const json s = reply.value("successor", json());
  return s.is_string() ? s.get<std::string>() : std::string();
}

std::vector<std::string> SnapshotAgentClient::finish(const std::string& job, bool node_only) {
  json request = {{"op", "finish"}, {"job", job}};
  if (node_only) request["scope"] = "node";
  json reply = checked(request, timeout_);
  std::vector<std::string> removed;
  if (reply.contains("removed") && reply["removed"].is_array())
    for (const json& n : reply["removed"])
      if (n.is_string()) removed.push_back(n.get<std::string>());
  io_->close();  // the agent exits
  return removed;
}

}  // namespace weft::checkpoint
