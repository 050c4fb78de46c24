// Seeded random-frame fuzzing of the store server: thousands of well-formed, mutated and
// random frames over raw sockets. The server must answer what is well-formed, close what is
// not, and keep serving its good clients exactly. Reproduce with WEFT_STORE_FUZZ_SEED=<seed>.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "base/check.h"
#include "base/env.h"
#include "base/error.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/comm/store_raw_client.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::TCPStore;
using comm::TCPStoreServer;
using comm::TCPStoreServerOptions;
using comm::wire::Op;

constexpr size_t kMaxValue = 4 << 10;

TCPStoreServerOptions fuzz_limits() {
  TCPStoreServerOptions o;
  o.max_client_bytes = 256 << 10;
  o.max_value_bytes = kMaxValue;
  return o;
}

class FrameGen {
 public:
  explicit FrameGen(uint64_t seed) : rng_(seed) {}

  // One frame: well-formed (answered), mutated from a well-formed one, or plain noise.
  Bytes next() {
    switch (below(10)) {
      case 0:
      case 1:
      case 2:
      case 3:
        return valid();
      case 4:
      case 5:
      case 6:
      case 7:
        return mutate(valid());
      case 8:
        return noise();
      default:
        return lying_header();
    }
  }

 private:
  uint64_t below(uint64_t n) { return rng_() % n; }
  std::string key() {
    // A small pool so that writes, waits and CAS meet each other; "good/" is never generated.
    static const char* pool[] = {"a",         "b",         "c", "counter",
                                 "epoch/1/x", "epoch/2/x", "",  "k\xff\x00"};
    return pool[below(8)];
  }
  Bytes value() {
    // Mostly small; sometimes just over the value limit (answered with an error).
    size_t n = below(20) == 0 ? kMaxValue + below(3) : below(64);
    Bytes b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng_());
    if (below(4) == 0) {  // decimal, so add() sometimes succeeds on it
      std::string d = std::to_string(static_cast<int64_t>(below(1000)));
      b.assign(d.begin(), d.end());
    }
    return b;
  }
  std::vector<std::string> keys() {
    std::vector<std::string> k(below(4));
    for (auto& s : k) s = key();
    return k;
  }
  int64_t wait_ms() { return below(8) == 0 ? 600'000 : static_cast<int64_t>(below(30)); }

  Bytes valid() {
    auto op = static_cast<Op>(1 + below(comm::wire::kMaxOp));
    auto w = request(rng_(), op);
    switch (op) {
      case Op::kPing:
        break;
      case Op::kSet:
        w.str(key()).bytes(value()).i64(below(3) == 0 ? static_cast<int64_t>(below(50)) : 0);
        break;
      case Op::kGet:
        w.str(key()).i64(wait_ms());
        break;
      case Op::kAdd:
        w.str(key()).i64(static_cast<int64_t>(rng_()));
        break;
      case Op::kCompareSet:
        w.str(key()).bytes(below(2) ? Bytes{} : value()).bytes(value());
        break;
      case Op::kWait:
        w.strings(keys()).i64(wait_ms());
        break;
      case Op::kCheck:
        w.strings(keys());
        break;
      case Op::kErase:
        w.str(key());
        break;
      case Op::kNumKeys:
        w.str(below(2) ? "" : "epoch/");
        break;
      case Op::kAppend:
        w.str(key()).bytes(value());
        break;
      case Op::kMultiGet:
        w.strings(keys()).i64(wait_ms());
        break;
      case Op::kSetBound:
        w.str(key()).bytes(value()).i64(below(3) == 0 ? static_cast<int64_t>(below(50)) : 0);
        break;
      case Op::kGoodbye:
        break;
      case Op::kOwner:  // mostly a process that is not the client: the server refuses to watch it
        w.i64(below(2) ? static_cast<int64_t>(::getpid()) : static_cast<int64_t>(rng_()))
            .u64(rng_())
            .u64(rng_())
            .u64(rng_());
        break;
      case Op::kWaitGone:
        w.strings(keys()).i64(wait_ms());
        break;
      case Op::kMultiSet: {
        uint32_t n = static_cast<uint32_t>(below(4));
        w.u32(n);
        for (uint32_t i = 0; i < n; ++i) w.str(key()).bytes(value());
        break;
      }
    }
    return w.finish();
  }

  Bytes mutate(Bytes f) {
    switch (below(6)) {
      case 0:  // flip a few bits anywhere, the length prefix included
        for (uint64_t i = 0, n = 1 + below(4); i < n; ++i)
          f[below(f.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // truncate (the next frame's bytes then land in this one's body)
        f.resize(below(f.size()));
        break;
      case 2:  // garbage appended inside the frame: length grows, arguments do not
        for (uint64_t i = 0, n = 1 + below(16); i < n; ++i)
          f.push_back(static_cast<uint8_t>(rng_()));
        for (int i = 0; i < 4; ++i) f[i] = static_cast<uint8_t>((f.size() - 4) >> (8 * i));
        break;
      case 3:  // an op code outside the table
        if (f.size() > 12) f[12] = static_cast<uint8_t>(comm::wire::kMaxOp + 1 + below(200));
        break;
      case 4:  // a huge count or length right after the op
        if (f.size() >= 17) f[13] = f[14] = f[15] = f[16] = 0xff;
        break;
      default:  // a random length prefix
        for (int i = 0; i < 4; ++i) f[i] = static_cast<uint8_t>(rng_());
        break;
    }
    return f;
  }

  Bytes noise() {
    Bytes b(below(64));
    for (auto& x : b) x = static_cast<uint8_t>(rng_());
    return b;
  }

  // A header promising more than is sent, up to and past the per-client bound.
  Bytes lying_header() {
    uint32_t len =
        below(2) ? static_cast<uint32_t>(rng_()) : static_cast<uint32_t>(9 + below(1 << 20));
    Bytes b = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
    for (uint64_t i = 0, n = below(32); i < n; ++i) b.push_back(static_cast<uint8_t>(rng_()));
    return b;
  }

  std::mt19937_64 rng_;
};

// A reply body the server sent: id, a known status, and for errors a readable message.
bool well_formed_reply(const Bytes& body) {
  if (body.size() < comm::wire::kMinBody) return false;
  uint8_t status = body[8];
  if (status > static_cast<uint8_t>(comm::wire::Status::kError)) return false;
  if (status == 0) return true;
  try {
    comm::wire::Reader r(body.data() + 9, body.size() - 9);
    r.str();
    r.expect_end();
    return true;
  } catch (const CommError&) {
    return false;
  }
}

TEST(StoreFuzz, RandomAndMutatedFramesNeverHurtTheServer) {
  const uint64_t seed = static_cast<uint64_t>(env_int("WEFT_STORE_FUZZ_SEED", 20240611));
  const int connections = static_cast<int>(env_int("WEFT_STORE_FUZZ_CONNECTIONS", 1500));
  SCOPED_TRACE(str("WEFT_STORE_FUZZ_SEED=", seed));
  TCPStoreServer server(fuzz_limits());
  TCPStore good("127.0.0.1", server.port(), 60s);
  good.set_string("good/anchor", "steady");
  std::string released;
  std::thread parked([&] { released = good.get_string("good/fuzz-done"); });

  FrameGen gen(seed);
  int frames = 0, replies = 0, bad_replies = 0, hung = 0;
  for (int c = 0; c < connections; ++c) {
    RawClient raw(server.port());
    Bytes stream;
    for (int i = 0, n = 1 + c % 6; i < n; ++i, ++frames) {
      Bytes f = gen.next();
      stream.insert(stream.end(), f.begin(), f.end());
    }
    raw.send(stream);  // may fail part-way: the server is allowed to hang up first
    raw.shutdown_write();
    while (auto body = raw.recv_frame()) {
      ++replies;
      if (!well_formed_reply(*body)) ++bad_replies;
    }
    if (raw.guard_hit()) ++hung;
    if (c % 100 == 99) {  // a good client in the middle of it all is served exactly
      ASSERT_EQ(good.add("good/rounds", 1), (c + 1) / 100);
      ASSERT_EQ(good.get_string("good/anchor"), "steady");
    }
  }
  EXPECT_EQ(hung, 0) << "the server neither answered nor closed a connection";
  EXPECT_EQ(bad_replies, 0);
  EXPECT_GT(replies, 0) << "no well-formed frame was answered";
  auto s = server.stats();
  EXPECT_GT(s.dropped_malformed, 0u) << "no malformed frame was detected";
  EXPECT_EQ(s.connections_accepted, uint64_t(connections) + 1);
  std::printf(
      "fuzz: seed %llu, %d frames on %d connections, %d replies, %llu dropped malformed, "
      "%llu over limit\n",
      (unsigned long long)seed, frames, connections, replies,
      (unsigned long long)s.dropped_malformed, (unsigned long long)s.dropped_over_limit);

  // The good client's wait survived everything and is released normally.
  good.set_string("good/fuzz-done", "yes");
  parked.join();
  EXPECT_EQ(released, "yes");
  EXPECT_EQ(good.get_string("good/anchor"), "steady");
  TCPStore late("127.0.0.1", server.port(), 10s);
  EXPECT_EQ(late.add("good/rounds", 0), connections / 100);
}

TEST(StoreFuzz, GarbageFromManyThreadsWhileGoodClientsCountExactly) {
  const uint64_t seed = static_cast<uint64_t>(env_int("WEFT_STORE_FUZZ_SEED", 20240611)) + 1;
  SCOPED_TRACE(str("WEFT_STORE_FUZZ_SEED=", seed - 1));
  TCPStoreServer server(fuzz_limits());
  constexpr int kFuzzers = 3, kGood = 3, kAdds = 300, kConnectionsEach = 200;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kFuzzers; ++t)
    threads.emplace_back([&, t] {
      FrameGen gen(seed * 31 + t);
      for (int c = 0; c < kConnectionsEach; ++c) {
        RawClient raw(server.port());
        Bytes f = gen.next();
        raw.send(f);
        raw.close();  // vanish without reading anything
      }
    });
  for (int t = 0; t < kGood; ++t)
    threads.emplace_back([&] {
      try {
        TCPStore s("127.0.0.1", server.port(), 60s);
        for (int i = 0; i < kAdds; ++i) s.add("good/total", 1);
      } catch (const std::exception&) {
        ++errors;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, 0);
  TCPStore check("127.0.0.1", server.port(), 10s);
  EXPECT_EQ(check.get_string("good/total"), std::to_string(kGood * kAdds));
}

}  // namespace
}  // namespace weft::test
