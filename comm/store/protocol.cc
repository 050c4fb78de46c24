// Encoding and bounds-checked decoding of store frames (format in protocol.h).
#include "comm/store/protocol.h"

#include <limits>

namespace weft::comm::wire {

const char* op_name(Op op) {
  switch (op) {
    case Op::kPing:
      return "ping";
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kCompareSet:
      return "compare_set";
    case Op::kWait:
      return "wait";
    case Op::kCheck:
      return "check";
    case Op::kErase:
      return "erase";
    case Op::kNumKeys:
      return "num_keys";
    case Op::kAppend:
      return "append";
    case Op::kOwner:
      return "owner";
    case Op::kMultiGet:
      return "multi_get";
    case Op::kMultiSet:
      return "multi_set";
    case Op::kSetBound:
      return "set_bound";
    case Op::kGoodbye:
      return "goodbye";
    case Op::kWaitGone:
      return "wait_gone";
  }
  return "unknown";
}

Writer& Writer::u8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}

Writer& Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

Writer& Writer::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

Writer& Writer::bytes(const uint8_t* p, size_t n) {
  if (n > std::numeric_limits<uint32_t>::max()) throw ProtocolError("blob longer than 4 GiB");
  u32(static_cast<uint32_t>(n));
  buf_.insert(buf_.end(), p, p + n);
  return *this;
}

Writer& Writer::strings(const std::vector<std::string>& v) {
  u32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) str(s);
  return *this;
}

Bytes Writer::finish() {
  size_t body = buf_.size() - kLengthBytes;
  if (body > std::numeric_limits<uint32_t>::max()) throw ProtocolError("frame longer than 4 GiB");
  for (int i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(body >> (8 * i));
  return std::move(buf_);
}

uint32_t decode_length(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

const uint8_t* Reader::need(size_t n) {
  if (remaining() < n)
    throw ProtocolError("truncated frame: need " + std::to_string(n) + " bytes, " +
                        std::to_string(remaining()) + " left");
  const uint8_t* at = p_;
  p_ += n;
  return at;
}

uint8_t Reader::u8() { return *need(1); }

uint32_t Reader::u32() { return decode_length(need(4)); }

uint64_t Reader::u64() {
  const uint8_t* p = need(8);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Bytes Reader::bytes() {
  uint32_t n = u32();
  const uint8_t* p = need(n);
  return Bytes(p, p + n);
}

std::string Reader::str() {
  uint32_t n = u32();
  const uint8_t* p = need(n);
  return std::string(reinterpret_cast<const char*>(p), n);
}

std::vector<std::string> Reader::strings() {
  uint32_t n = u32();
  // Each string costs at least its 4-byte length: a larger count is a lie, and trusting it
  // would let a 9-byte frame make the server reserve gigabytes.
  if (n > remaining() / 4)
    throw ProtocolError("list count " + std::to_string(n) + " exceeds frame");
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(str());
  return out;
}

void Reader::expect_end() const {
  if (p_ != end_)
    throw ProtocolError(std::to_string(remaining()) + " trailing bytes after arguments");
}

}  // namespace weft::comm::wire
