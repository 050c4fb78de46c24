// EtcdStore: each Store operation as etcd v3 requests (etcd_kv.h) sent through EtcdHttp.
#include "comm/store/etcd_store.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string_view>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "comm/store/etcd_http.h"
#include "comm/store/etcd_kv.h"
#include "comm/store/etcd_watch.h"
#include "comm/store/store_util.h"

namespace weft::comm {

using etcd::json;
using Clock = std::chrono::steady_clock;

namespace {
// Range ops per read txn: well under etcd's --max-txn-ops (128 by default).
constexpr size_t kReadBatch = 64;
// Where no watch can be made, blocking reads poll: often at first (a key that is about to
// appear), then less often (a rendezvous that waits for a slow node need not load etcd).
constexpr Millis kFirstPoll{2}, kMaxPoll{50};
// A parked wait reads its keys again after this long without an event: a member that
// stopped without closing its connections (SIGSTOP, a cut cable) sends no events and no
// error, and it is the read (EtcdHttp's failover) that finds it and moves to another.
constexpr Millis kRecheck{1'000};
constexpr const char* kEndpointFlag = "--rdzv-endpoint";

int64_t grant(EtcdHttp& http, Millis ttl) {
  const int64_t ms = clamp_timeout(ttl).count();
  const int64_t seconds = std::max<int64_t>(1, (ms + 999) / 1000);  // etcd counts seconds
  json r = http.post("/v3/lease/grant", {{"TTL", std::to_string(seconds)}}, Replay::kSafe);
  const int64_t id = etcd::integer(r, "ID");
  if (id == 0) throw CommError("etcd: /v3/lease/grant returned no lease: " + r.dump());
  return id;
}

// Best effort: a lease that expired meanwhile is "not found", and a lease left behind
// expires by itself.
void revoke(EtcdHttp& http, int64_t lease) noexcept {
  try {
    http.post("/v3/lease/revoke", {{"ID", std::to_string(lease)}}, Replay::kSafe);
  } catch (const std::exception&) {
  }
}

// After a put or delete that returned the key's previous version (`prev_kv`): revokes the
// lease it was under unless it is still the key's (`kept`). Every lease EtcdStore grants
// holds one key, which has just left it, so the revoke deletes nothing.
void revoke_replaced(EtcdHttp& http, const json& prev_kv, int64_t kept) {
  const int64_t old = etcd::integer(prev_kv, "lease");
  if (old != 0 && old != kept) revoke(http, old);
}
}  // namespace

EtcdStore::EtcdStore(EtcdStoreOptions options)
    : options_(std::move(options)), timeout_ms_(options_.timeout.count()) {
  if (options_.endpoints.empty())
    throw ConfigError(kEndpointFlag, "no etcd endpoint given (HOST:PORT of a member's client URL)");
  if (options_.request_timeout <= Millis(0) || options_.failover_timeout < Millis(0))
    throw ConfigError("etcd request_timeout", "must be positive (failover_timeout >= 0)");
  std::vector<EtcdEndpoint> endpoints;
  for (const auto& e : options_.endpoints)
    endpoints.push_back(parse_etcd_endpoint(e, kEndpointFlag));
  http_ = std::make_unique<EtcdHttp>(std::move(endpoints), options_.request_timeout,
                                     options_.failover_timeout);
}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::endpoint() const { return http_->endpoint(); }

void EtcdStore::ping() { num_keys_with_prefix(""); }

void EtcdStore::set(const std::string& key, const Bytes& value, std::optional<Millis> ttl) {
  const int64_t lease = ttl ? grant(*http_, *ttl) : 0;
  json reply;
  try {
    reply =
        http_->post("/v3/kv/put", etcd::put_request(full(key), value, lease, false), Replay::kSafe);
  } catch (...) {
    if (lease) revoke(*http_, lease);
    throw;
  }
  if (auto prev = reply.find("prev_kv"); prev != reply.end()) revoke_replaced(*http_, *prev, lease);
}

std::vector<std::optional<Bytes>> EtcdStore::read(const std::vector<std::string>& keys,
                                                  bool values) {
  std::vector<std::optional<Bytes>> out(keys.size());
  for (size_t begin = 0; begin < keys.size(); begin += kReadBatch) {
    const size_t end = std::min(keys.size(), begin + kReadBatch);
    json ops = json::array();
    for (size_t i = begin; i < end; ++i) ops.push_back(etcd::range_op(full(keys[i]), !values));
    // A txn without compares runs its "success" ops: the keys are read at one revision.
    json r = http_->post("/v3/kv/txn", {{"success", ops}}, Replay::kSafe);
    for (size_t i = begin; i < end; ++i) {
      const json& range = etcd::range_response(r, i - begin);
      if (!values) {
        if (etcd::integer(range, "count") > 0) out[i] = Bytes{};
      } else if (auto kv = etcd::first_kv(range)) {
        out[i] = std::move(kv->value);
      }
    }
  }
  return out;
}

std::unique_ptr<EtcdWatch> EtcdStore::watch(const std::vector<std::string>& keys,
                                            Clock::time_point deadline, EtcdWatch::Events events,
                                            const std::stop_token& stop) {
  if (watch_unsupported_.load()) return nullptr;
  // One watch over the range from the least key to the greatest: events of keys between
  // them that nobody waits for are skipped by the caller.
  const auto [lo, hi] = std::minmax_element(keys.begin(), keys.end());
  const std::string first = full(*lo), last = full(*hi);
  try {
    return std::make_unique<EtcdWatch>(parse_etcd_endpoint(http_->endpoint(), kEndpointFlag), first,
                                       first == last ? std::string() : last + std::string(1, '\0'),
                                       /*start_revision=*/0,
                                       std::min(deadline, Clock::now() + options_.request_timeout),
                                       events, stop);
  } catch (const EtcdWatchUnsupported& e) {
    watch_unsupported_.store(true);
    WEFT_DEBUG("etcd", e.what(), "; blocking reads poll instead");
  } catch (const CommError& e) {
    if (stop.stop_requested()) return nullptr;  // the caller's stop, not the member's failure
    // The member the reads go to just failed: the next read moves on and the next wait
    // watches there. Until then, one poll.
    if (!watch_failed_.exchange(true))
      WEFT_DEBUG("etcd", e.what(), "; polling until a watch can be made");
  }
  return nullptr;
}

std::optional<std::vector<std::optional<Bytes>>> EtcdStore::park(
    const std::vector<std::string>& keys, Millis timeout, const Until& until,
    const std::stop_token& stop) {
  const auto deadline = Clock::now() + clamp_timeout(timeout);
  const std::set<std::string> waited = [&] {
    std::set<std::string> s;
    for (const auto& k : keys) s.insert(full(k));
    return s;
  }();
  std::unique_ptr<EtcdWatch> watch;
  Millis pause = kFirstPoll;
  for (;;) {
    if (stop.stop_requested()) return std::nullopt;
    auto got = read(keys, until.values);
    if (until.reached(got)) return got;
    const auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(until.timed_out() + " (etcd, keys under '" + options_.prefix + "')");
    // The watch follows the reads: when they failed over, the watch's member may be dead.
    if (watch && watch->member().text() != http_->endpoint()) watch.reset();
    // From etcd's current revision, then read again: a change between the first read and
    // the watch is seen by that read, a later one is an event. Not from the read's revision
    // + 1: a watch that starts at a revision etcd has passed (any write in between, a
    // heartbeat anywhere) is "unsynced", and etcd catches such watches up only every 100 ms
    // (syncWatchersLoop), so the event that woke everyone else came up to 100 ms late here:
    // the trailing survivor of issue 14, whose wait for node 0's workers' store raced the set.
    if (!watch) {
      watch = this->watch(keys, deadline, until.events, stop);
      if (watch) continue;
    }
    if (!watch) {
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, kMaxPoll);
      continue;
    }
    // Parked until one of the keys changes, kRecheck passes, the deadline or a stop; then
    // read (or return, stopped).
    try {
      const auto recheck = std::min(deadline, now + kRecheck);
      for (bool woken = false; !woken;) {
        auto changed = watch->next(recheck);
        if (changed.empty()) break;
        woken = std::any_of(changed.begin(), changed.end(),
                            [&](const std::string& k) { return waited.count(k) > 0; });
      }
    } catch (const CommError& e) {
      WEFT_DEBUG("etcd", e.what(), "; reading again and watching anew");
      watch.reset();
    }
  }
}

std::optional<std::vector<std::optional<Bytes>>> EtcdStore::await(
    const std::vector<std::string>& keys, Millis timeout, bool values,
    const std::stop_token& stop) {
  Until until;
  until.values = values;
  until.events = EtcdWatch::Events::kAll;
  until.reached = [](const std::vector<std::optional<Bytes>>& got) {
    return std::all_of(got.begin(), got.end(), [](const auto& v) { return v.has_value(); });
  };
  until.timed_out = [&] { return timeout_message(keys, timeout); };
  return park(keys, timeout, until, stop);
}

bool EtcdStore::waits_for_absence() const { return true; }

std::vector<std::string> EtcdStore::wait_gone(const std::vector<std::string>& keys,
                                              Millis timeout) {
  return *wait_gone_stoppable(keys, timeout, {});
}

std::optional<std::vector<std::string>> EtcdStore::wait_gone_stoppable(
    const std::vector<std::string>& keys, Millis timeout, std::stop_token stop) {
  Until until;
  until.values = false;
  // Only removals wake it: a heartbeat's set of a waited key (every beat, on every member's
  // alive key) would otherwise cost a read each.
  until.events = EtcdWatch::Events::kDeletes;
  until.reached = [&](const std::vector<std::optional<Bytes>>& got) {
    return keys.empty() ||
           std::any_of(got.begin(), got.end(), [](const auto& v) { return !v.has_value(); });
  };
  until.timed_out = [&] { return gone_timeout_message(keys, timeout); };
  const auto got = park(keys, timeout, until, stop);
  if (!got) return std::nullopt;
  std::vector<std::string> absent;
  for (size_t i = 0; i < keys.size(); ++i)
    if (!(*got)[i]) absent.push_back(keys[i]);
  return absent;
}

Bytes EtcdStore::get(const std::string& key) {
  return std::move(*(*await({key}, timeout(), true, {}))[0]);
}

std::vector<Bytes> EtcdStore::multi_get(const std::vector<std::string>& keys) {
  auto got = await(keys, timeout(), true, {});  // named: a range-for would outlive it
  std::vector<Bytes> out;
  for (auto& v : *got) out.push_back(std::move(*v));
  return out;
}

void EtcdStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  await(keys, timeout, false, {});
}

bool EtcdStore::wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                               std::stop_token stop) {
  return await(keys, timeout, false, stop).has_value();
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  auto got = read(keys, false);
  return std::all_of(got.begin(), got.end(), [](const auto& v) { return v.has_value(); });
}

std::pair<Bytes, bool> EtcdStore::cas(
    const std::string& key,
    const std::function<std::optional<Bytes>(const std::optional<Bytes>&)>& next, bool replayable) {
  const std::string k = full(key);
  // First guess: the key is absent. A new counter then costs one round trip, and the failed
  // compare of an existing key returns its current version for the next try.
  std::optional<etcd::Kv> cur;
  bool known = false;  // `cur` came from etcd
  for (;;) {
    std::optional<Bytes> want = next(cur ? std::optional<Bytes>(cur->value) : std::nullopt);
    if (!want) {
      if (known) return {cur ? cur->value : Bytes{}, false};
      cur = etcd::first_kv(http_->post("/v3/kv/range", {{"key", etcd::base64(k)}}, Replay::kSafe));
      known = true;
      continue;
    }
    // ignore_lease keeps the key's lease, hence its expiry (the contract for add, append
    // and compare_set); a key that is absent has none to keep.
    json txn = {{"compare", json::array({cur ? etcd::mod_revision_is(k, cur->mod_revision)
                                             : etcd::absent(k)})},
                {"success", json::array({etcd::put_op(k, *want, 0, cur.has_value())})},
                {"failure", json::array({etcd::range_op(k, false)})}};
    json r = http_->post("/v3/kv/txn", txn, replayable ? Replay::kSafe : Replay::kUnsafe);
    if (etcd::succeeded(r)) return {std::move(*want), true};
    cur = etcd::first_kv(etcd::range_response(r, 0));
    known = true;
  }
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  // Not replayable: if a txn that landed were sent again and found the key changed (by
  // itself), the loop would add delta a second time.
  cas(
      key,
      [&](const std::optional<Bytes>& cur) -> std::optional<Bytes> {
        int64_t now = 0;
        if (cur) {
          std::string_view t(reinterpret_cast<const char*>(cur->data()), cur->size());
          auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), now);
          if (t.empty() || ec != std::errc() || end != t.data() + t.size())
            throw CommError("store: add on '" + key + "' whose value is not a decimal integer");
        }
        if (__builtin_add_overflow(now, delta, &result))
          throw CommError("store: add on '" + key + "' overflows int64");
        std::string s = std::to_string(result);
        return Bytes(s.begin(), s.end());
      },
      /*replayable=*/false);
  return result;
}

void EtcdStore::append(const std::string& key, const Bytes& value) {
  cas(
      key,
      [&](const std::optional<Bytes>& cur) -> std::optional<Bytes> {
        Bytes out = cur ? *cur : Bytes{};
        out.insert(out.end(), value.begin(), value.end());
        return out;
      },
      /*replayable=*/false);
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  if (!expected.empty()) {
    // One round trip: the value compare fails on an absent key, as the contract wants.
    const std::string k = full(key);
    json txn = {{"compare", json::array({etcd::value_is(k, expected)})},
                {"success", json::array({etcd::put_op(k, desired, 0, true)})},
                {"failure", json::array({etcd::range_op(k, false)})}};
    json r = http_->post("/v3/kv/txn", txn, Replay::kSafe);
    if (etcd::succeeded(r)) return desired;
    auto kv = etcd::first_kv(etcd::range_response(r, 0));
    return kv ? kv->value : Bytes{};
  }
  // An empty `expected` matches an absent key and a key holding "": no single compare says
  // both, so the mod_revision loop. Replayable: a landed write sent again fails its compare,
  // and the loop then finds `desired` there, which it reports as written.
  return cas(
             key,
             [&](const std::optional<Bytes>& cur) -> std::optional<Bytes> {
               if (!cur || cur->empty()) return desired;
               return std::nullopt;
             },
             /*replayable=*/true)
      .first;
}

bool EtcdStore::erase(const std::string& key) {
  // Not replayable: sent again after it landed, it would report that the key was absent.
  json r = http_->post("/v3/kv/deleterange", {{"key", etcd::base64(full(key))}, {"prev_kv", true}},
                       Replay::kUnsafe);
  if (auto prev = r.find("prev_kvs"); prev != r.end() && prev->is_array())
    for (const auto& kv : *prev) revoke_replaced(*http_, kv, 0);
  return etcd::integer(r, "deleted") > 0;
}

int64_t EtcdStore::num_keys() { return num_keys_with_prefix(""); }

int64_t EtcdStore::num_keys_with_prefix(const std::string& prefix) {
  const std::string from = full(prefix);
  json req = {{"key", etcd::base64(from.empty() ? std::string(1, '\0') : from)},
              {"range_end", etcd::base64(etcd::prefix_end(from))},
              {"count_only", true}};
  return etcd::integer(http_->post("/v3/kv/range", req, Replay::kSafe), "count");
}

void EtcdStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  check_multi_set(keys, values);
  // etcd refuses a txn that puts one key twice; the last value wins, as with sets in order.
  std::map<std::string, const Bytes*> last;
  for (size_t i = 0; i < keys.size(); ++i) last[full(keys[i])] = &values[i];
  if (last.empty()) return;
  json ops = json::array();
  for (const auto& [k, v] : last) ops.push_back(etcd::put_op(k, *v, 0, false));
  json r = http_->post("/v3/kv/txn", {{"success", ops}}, Replay::kSafe);
  if (auto rs = r.find("responses"); rs != r.end() && rs->is_array())
    for (const auto& op : *rs)
      if (auto put = op.find("response_put"); put != op.end())
        if (auto prev = put->find("prev_kv"); prev != put->end()) revoke_replaced(*http_, *prev, 0);
}

std::vector<std::string> parse_etcd_endpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (;;) {
    size_t comma = list.find(',', begin);
    std::string item = list.substr(begin, comma == std::string::npos ? comma : comma - begin);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.empty())
      throw ConfigError(kEndpointFlag, "'" + list + "': expected HOST:PORT[,HOST:PORT...]");
    parse_etcd_endpoint(item, kEndpointFlag);
    out.push_back(item);
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

std::unique_ptr<Store> make_etcd_store(const std::vector<std::string>& endpoints,
                                       const std::string& prefix, Millis timeout) {
  EtcdStoreOptions o;
  o.endpoints = endpoints;
  o.prefix = prefix;
  o.timeout = timeout;
  auto store = std::make_unique<EtcdStore>(std::move(o));
  store->ping();
  return store;
}

}  // namespace weft::comm
