// The snapshot agent's peers (snapshot.redundancy: replica or ec): the TCP listener, the
// requests other nodes' agents send it, and `peers`, which gives it an epoch's ring.
#include <optional>

#include "base/check.h"
#include "base/host.h"
#include "comm/store/auth.h"
#include "launch/snapshot_agent_server.h"

namespace weft::launch::agent_server {

void Agent::start_peers() {
  if (o_.listen.empty()) return;
  ckpt::PeerAuth auth;
  auth.job = o_.job_id;
  auth.token = comm::auth::token_from_env();
  auth.insecure = o_.insecure;
  const auto timeout = ckpt::default_snapshot_call_timeout();
  if (auth.token.empty() && !o_.insecure &&
      !comm::auth::is_loopback(split_endpoint(o_.listen).first))
    say(str("no job token (WEFT_JOB_TOKEN): peers are accepted from this machine only"));
  if (o_.redundancy == "ec") {
    parity_ = std::make_unique<SnapshotParity>(
        ParityOptions{auth, o_.ec_k, o_.ec_m, timeout, o_.guardian_pid}, say);
    parity_->adopt();
  } else {
    replicas_ = std::make_unique<SnapshotReplicas>(ReplicaOptions{auth, timeout, o_.guardian_pid},
                                                   say);
    replicas_->adopt();
  }
  const auto [host, port] = split_endpoint(o_.listen);
  listener_ = std::make_unique<ckpt::PeerListener>(
      host, port, auth, [this](ckpt::PeerChannel& ch) { serve_peer(ch); }, say, timeout);
}

// A peer's connection (a transport thread): replica pushes, or parity's chunk, stripe and
// fetch requests, one after another.
void Agent::serve_peer(ckpt::PeerChannel& ch) {
  for (;;) {
    const json h = ch.receive_request();
    if (replicas_ && replicas_->serve(ch, h)) continue;
    if (parity_ && parity_->serve(ch, h)) continue;
    ch.send({{"ok", false},
             {"error", str("unknown op for snapshot.redundancy ", o_.redundancy)}});
    throw IoError("an unknown request: " + h.dump().substr(0, 200));
  }
}

// `peers`: the ring of an epoch. The node's newest snapshots of that epoch go to the new
// successor at once (the stage takes each segment's newest commit).
json Agent::peers(const json& req) {
  if (!listener_)
    return refusal(
        "this agent was started without --listen: it has no peers (it neither sends "
        "nor receives replicas)");
  if (!req.contains("job") || !req["job"].is_string() || req["job"] != o_.job_id)
    return refusal(str("bad request: peers needs \"job\" (this agent serves job ", o_.job_id, ")"));
  if (!req.contains("epoch") || !req["epoch"].is_number_integer() || !req.contains("node") ||
      !req["node"].is_number_integer() || !req.contains("nodes") || !req["nodes"].is_array())
    return refusal(
        "bad request: peers needs \"epoch\", \"node\" (integers) and \"nodes\" (an array)");
  ReplicaRing r;
  r.epoch = req["epoch"].get<int64_t>();
  r.node = req["node"].get<int>();
  for (const json& n : req["nodes"]) {
    if (!n.is_string()) return refusal("bad request: peers' \"nodes\" are \"host:port\" strings");
    split_endpoint(n.get<std::string>());  // std::invalid_argument: a bad request
    r.nodes.push_back(n.get<std::string>());
  }
  if (r.epoch < 0 || r.node < 0 || r.node >= int(r.nodes.size()))
    return refusal(str("bad request: node ", r.node, " of ", r.nodes.size(), ", epoch ", r.epoch));
  if (r.epoch < ring_epoch_)
    return refusal(
        str("epoch ", r.epoch, " is older than the ring this agent has (epoch ", ring_epoch_, ")"));
  ring_epoch_ = r.epoch;
  const std::optional<int> next = r.successor();
  const std::string to = next && replicas_ ? r.nodes[size_t(*next)] : std::string();
  const int64_t epoch = r.epoch;
  if (replicas_) replicas_->set_ring(std::move(r));
  if (parity_) parity_->set_ring(std::move(r));
  for (const auto& [name, x] : owned_) {
    if (x.epoch != epoch) continue;
    try {
      if (std::optional<ckpt::SnapshotSegment::View> v = x.segment->latest()) {
        CommittedEvent e{name, x.segment, v->meta};
        locate(e, epoch);
        stage_.post(std::move(e));
      }
    } catch (const std::exception&) {
    }
  }
  json reply = {{"ok", true}};
  reply["successor"] = to.empty() ? json(nullptr) : json(to);
  return reply;
}

}  // namespace weft::launch::agent_server
