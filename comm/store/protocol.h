// The store's wire format, shared by TCPStoreServer and TCPStore: length-prefixed frames
// with a request id, so one connection pipelines requests and holds several waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/store.h"

namespace weft::comm::wire {

// Frame = u32 body length | body. Integers are little-endian on the wire whatever the host.
//   request body: u64 request id | u8 Op | arguments
//   reply body:   u64 request id | u8 Status | payload (kError/kTimeout: a string message)
// Strings and byte blobs are u32 length + bytes; lists are a u32 count then the items.
//
// Op        arguments                              kOk payload
// kPing     -                                      -
// kSet      key, value, i64 ttl_ms (0: none)       -
// kGet      key, i64 timeout_ms                    value          (blocks server-side)
// kAdd      key, i64 delta                         i64 new value
// kCompareSet key, expected, desired               value after the call (empty: absent)
// kWait     keys, i64 timeout_ms                   -              (blocks server-side)
// kCheck    keys                                   u8 all present
// kErase    key                                    u8 existed
// kNumKeys  string prefix ("" counts all)          i64
// kAppend   key, value                             -
// kMultiGet keys, i64 timeout_ms                   list of values (blocks server-side)
// kMultiSet list of (key, value)                   -
// kSetBound key, value, i64 ttl_ms (0: none)       -     kSet, the key bound to this
//                                                        connection (SetOptions::bind)
// kGoodbye  -                                      -     the client is closing on purpose:
//                                                        its bound keys go now, no grace
// kOwner    i64 pid, u64 pid_ns_dev, u64 pid_ns_ino,   u8 watched: the server will drop
//           u64 start_ticks (client_process.h)     this connection's bound keys as soon as
//                                                  that process has exited, not after the
//                                                  grace (a client on its machine only)
// kWaitGone keys, i64 timeout_ms                   list of the keys absent (blocks server-
//                                                  side until one is: erased, expired,
//                                                  a bound key dropped; Store::wait_gone)
//
// kSetBound and kGoodbye are sent only to a server whose hello has kHelloBindsKeys, kOwner
// only to one whose hello has kHelloWatchesOwners, kWaitGone only to one whose hello has
// kHelloWaitsGone (an older server closes a connection that
// sends an op it does not know); older clients never send them and ignore the flags, so old
// and new clients and servers mix.
//
// Handshake, before any request (same framing):
//   server -> client  hello:   u8 kHandshakeVersion | u8 flags (kHelloTokenRequired,
//                              kHelloBindsKeys, kHelloWatchesOwners, kHelloWaitsGone) | nonce
//   client -> server  proof:   u8 kHandshakeVersion | proof (HMAC-SHA256(token, nonce ||
//                              auth::kProofContext); empty when the client has no token)
//   server -> client  verdict: u8 Status (kOk, or kError then a string reason)
// After a kError verdict the server closes the connection. The token itself never crosses
// the wire; a fresh nonce per connection makes a recorded proof useless for another one.
enum class Op : uint8_t {
  kPing = 1,
  kSet,
  kGet,
  kAdd,
  kCompareSet,
  kWait,
  kCheck,
  kErase,
  kNumKeys,
  kAppend,
  kMultiGet,
  kMultiSet,
  kSetBound,
  kGoodbye,
  kOwner,
  kWaitGone,
};
constexpr uint8_t kMaxOp = static_cast<uint8_t>(Op::kWaitGone);

enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

constexpr uint8_t kHandshakeVersion = 1;
constexpr uint8_t kHelloTokenRequired = 1;
// The server binds keys to connections (kSetBound, kGoodbye).
constexpr uint8_t kHelloBindsKeys = 2;
// The server takes kOwner: it watches a client process on its machine and drops the keys
// bound to its connection once it has exited.
constexpr uint8_t kHelloWatchesOwners = 4;
// The server takes kWaitGone: a wait until one of some keys is absent.
constexpr uint8_t kHelloWaitsGone = 8;
// No handshake frame is longer: the server reads the proof with this bound.
constexpr size_t kMaxHandshakeBody = 256;

constexpr size_t kLengthBytes = 4;
// Request id + op (or status): the smallest body a well-formed frame has.
constexpr size_t kMinBody = 9;

const char* op_name(Op op);

// A frame that does not follow the format above. The server closes the connection that sent
// it; a client call that gets one throws it (a CommError) to its caller.
class ProtocolError : public CommError {
 public:
  using CommError::CommError;
};

// Builds one frame; finish() patches the length prefix.
class Writer {
 public:
  Writer() : buf_(kLengthBytes, 0) {}
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& u64(uint64_t v);
  Writer& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Writer& bytes(const uint8_t* p, size_t n);
  Writer& bytes(const Bytes& b) { return bytes(b.data(), b.size()); }
  Writer& str(const std::string& s) {
    return bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  Writer& strings(const std::vector<std::string>& v);
  // Patches the length and hands the frame over (the writer is spent). Throws
  // ProtocolError when the body does not fit the u32 length.
  Bytes finish();

 private:
  Bytes buf_;
};

// Reads one frame body; every read checks bounds and throws ProtocolError past the end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  Bytes bytes();
  std::string str();
  // A u32 count then that many strings; rejects counts the remaining bytes cannot hold.
  std::vector<std::string> strings();
  // Throws ProtocolError unless every byte was consumed (trailing garbage is malformed).
  void expect_end() const;
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* need(size_t n);
  const uint8_t* p_;
  const uint8_t* end_;
};

// Decodes the u32 length prefix at p (kLengthBytes bytes).
uint32_t decode_length(const uint8_t* p);

}  // namespace weft::comm::wire
