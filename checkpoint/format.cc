// metadata.json: written with the in-tree JSON helpers, read with core/io/json.h. Integers
// that may exceed 2^53 (hashes, checksums) are hex strings. The reader rebuilds the
// canonical text from what it parsed and checks it against metadata_crc32c.
#include "checkpoint/format.h"

#include <cstdio>
#include <sstream>

#include "base/error.h"
#include "checkpoint/crc32c.h"
#include "core/io/json.h"

namespace weft::checkpoint {

int Metadata::find_state(const std::string& name) const {
  for (size_t i = 0; i < states.size(); ++i)
    if (states[i].name == name) return int(i);
  return -1;
}

namespace {

using core::io::json_quote;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

std::string ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Reading: each accessor names what is missing.
struct Reader {
  const std::string& source;
  [[noreturn]] void fail(const std::string& what) const { throw IoError(source + ": " + what); }
  const core::io::JsonValue& at(const core::io::JsonValue& o, const char* key) const {
    const core::io::JsonValue* v = o.find(key);
    if (!v) fail(std::string("missing \"") + key + "\"");
    return *v;
  }
  int64_t i64(const core::io::JsonValue& o, const char* key) const {
    int64_t x;
    if (!at(o, key).as_int64(x)) fail(std::string("\"") + key + "\" is not an integer");
    return x;
  }
  std::string str(const core::io::JsonValue& o, const char* key) const {
    const core::io::JsonValue& v = at(o, key);
    if (v.kind != core::io::JsonValue::Kind::kString)
      fail(std::string("\"") + key + "\" is not a string");
    return v.text;
  }
  uint64_t hex64(const std::string& s, const char* what) const {
    size_t used = 0;
    uint64_t v = 0;
    try {
      v = std::stoull(s, &used, 16);
    } catch (const std::exception&) {
      used = 0;
    }
    if (s.empty() || used != s.size())
      fail(std::string(what) + " \"" + s + "\" is not hexadecimal");
    return v;
  }
  std::vector<int64_t> list(const core::io::JsonValue& o, const char* key) const {
    const core::io::JsonValue& v = at(o, key);
    if (v.kind != core::io::JsonValue::Kind::kArray)
      fail(std::string("\"") + key + "\" is not a list");
    std::vector<int64_t> out;
    for (const core::io::JsonValue& x : v.items) {
      int64_t n;
      if (!x.as_int64(n)) fail(std::string("\"") + key + "\" holds a non-integer");
      out.push_back(n);
    }
    return out;
  }
  const std::vector<core::io::JsonValue>& items(const core::io::JsonValue& o,
                                                const char* key) const {
    const core::io::JsonValue& v = at(o, key);
    if (v.kind != core::io::JsonValue::Kind::kArray)
      fail(std::string("\"") + key + "\" is not a list");
    return v.items;
  }
};

constexpr const char* kGenerator = "philox4x32-10";
// The text both forms end with; metadata_to_json inserts the checksum member before it.
constexpr const char* kClose = "\n}\n";

uint32_t canonical_crc(const Metadata& m) {
  const std::string c = metadata_canonical_json(m);
  return crc32c(c.data(), c.size());
}

}  // namespace

std::string metadata_to_json(const Metadata& m) {
  std::string c = metadata_canonical_json(m);
  const uint32_t crc = crc32c(c.data(), c.size());
  c.resize(c.size() - std::string(kClose).size());
  return c + ",\n  \"metadata_crc32c\": \"" + hex(crc).substr(8) + "\"" + kClose;
}

std::string metadata_canonical_json(const Metadata& m) {
  std::ostringstream o;
  o << "{\n  \"format\": " << json_quote(m.format) << ",\n";
  o << "  \"job_id\": " << json_quote(m.job_id) << ",\n";
  o << "  \"model_hash\": \"" << hex(m.model_hash) << "\",\n";
  o << "  \"model\": " << json_quote(m.model) << ",\n";
  o << "  \"step\": " << m.step << ",\n";
  o << "  \"rng\": {\"seed\": \"" << hex(m.seed) << "\", \"generator\": \"" << kGenerator
    << "\"},\n";
  o << "  \"data_cursor\": {\"step\": " << m.step << ", \"global_batch\": " << m.global_batch
    << ", \"sequence\": " << m.data_sequence << "},\n";
  o << "  \"layout\": " << json_quote(m.layout) << ",\n";
  o << "  \"block_bytes\": " << m.block_bytes << ",\n";
  o << "  \"states\": [";
  for (size_t i = 0; i < m.states.size(); ++i) {
    const StateRecord& s = m.states[i];
    o << (i ? ",\n    " : "\n    ") << "{\"name\": " << json_quote(s.name)
      << ", \"kind\": " << json_quote(s.kind)
      << ", \"dtype\": " << json_quote(core::dtype_name(s.dtype))
      << ", \"shape\": " << ints(s.shape) << "}";
  }
  o << "],\n  \"shards\": [";
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    o << (i ? ",\n    " : "\n    ") << "{\"file\": " << json_quote(s.file)
      << ", \"rank\": " << s.rank << ", \"bytes\": " << s.bytes << ", \"crc32c\": \""
      << hex(s.crc32c).substr(8) << "\",\n     \"block_crc32c\": [";
    for (size_t b = 0; b < s.block_crc32c.size(); ++b)
      o << (b ? "," : "") << "\"" << hex(s.block_crc32c[b]).substr(8) << "\"";
    o << "],\n     \"boxes\": [";
    for (size_t b = 0; b < s.boxes.size(); ++b) {
      const BoxRecord& x = s.boxes[b];
      o << (b ? ",\n       " : "\n       ") << "{\"state\": " << x.state
        << ", \"start\": " << ints(x.start) << ", \"extent\": " << ints(x.extent)
        << ", \"offset\": " << x.offset << ", \"bytes\": " << x.bytes << "}";
    }
    o << "]}";
  }
  o << "],\n  \"job\": " << json_quote(m.job_yaml) << kClose;
  return o.str();
}

Metadata metadata_from_json(const std::string& text, const std::string& source) {
  core::io::JsonValue root = core::io::parse_json(text, source);
  Reader r{source};
  Metadata m;
  m.format = r.str(root, "format");
  if (m.format == "weft-checkpoint/1")
    r.fail(std::string("format weft-checkpoint/1 predates metadata checksums; this weft reads ") +
           kFormat +
           " only: export the weights with the weft that wrote it (weft ckpt export) "
           "and weft ckpt import them, or train again");
  if (m.format != kFormat) r.fail("format \"" + m.format + "\" is not " + kFormat);
  m.job_id = r.str(root, "job_id");
  const uint32_t stored = uint32_t(r.hex64(r.str(root, "metadata_crc32c"), "metadata_crc32c"));
  m.model_hash = r.hex64(r.str(root, "model_hash"), "model_hash");
  m.model = r.str(root, "model");
  m.step = r.i64(root, "step");
  m.seed = r.hex64(r.str(r.at(root, "rng"), "seed"), "rng.seed");
  if (r.str(r.at(root, "rng"), "generator") != kGenerator)
    r.fail(std::string("rng.generator is not ") + kGenerator);
  const core::io::JsonValue& cursor = r.at(root, "data_cursor");
  if (r.i64(cursor, "step") != m.step) r.fail("data_cursor.step differs from step");
  m.global_batch = r.i64(cursor, "global_batch");
  m.data_sequence = r.i64(cursor, "sequence");
  m.layout = r.str(root, "layout");
  m.block_bytes = r.i64(root, "block_bytes");
  if (m.block_bytes <= 0) r.fail("block_bytes must be positive");
  m.job_yaml = r.str(root, "job");
  for (const core::io::JsonValue& s : r.items(root, "states")) {
    StateRecord st;
    st.name = r.str(s, "name");
    st.kind = r.str(s, "kind");
    try {
      st.dtype = core::parse_dtype(r.str(s, "dtype"), "dtype");
    } catch (const ConfigError& e) {
      r.fail(std::string("state ") + st.name + ": " + e.what());
    }
    st.shape = r.list(s, "shape");
    m.states.push_back(std::move(st));
  }
  for (const core::io::JsonValue& s : r.items(root, "shards")) {
    ShardRecord sh;
    sh.file = r.str(s, "file");
    if (sh.file.empty() || sh.file.find('/') != std::string::npos || sh.file[0] == '.')
      r.fail("shard file name \"" + sh.file + "\" must be a plain name inside the step folder");
    sh.rank = int(r.i64(s, "rank"));
    sh.bytes = r.i64(s, "bytes");
    sh.crc32c = uint32_t(r.hex64(r.str(s, "crc32c"), "crc32c"));
    for (const core::io::JsonValue& c : r.items(s, "block_crc32c")) {
      if (c.kind != core::io::JsonValue::Kind::kString) r.fail("block_crc32c holds a non-string");
      sh.block_crc32c.push_back(uint32_t(r.hex64(c.text, "block_crc32c")));
    }
    if (int64_t(sh.block_crc32c.size()) != (sh.bytes + m.block_bytes - 1) / m.block_bytes)
      r.fail("shard " + sh.file + " lists " + std::to_string(sh.block_crc32c.size()) +
             " block checksums for " + std::to_string(sh.bytes) + " bytes");
    for (const core::io::JsonValue& b : r.items(s, "boxes")) {
      BoxRecord x;
      x.state = int(r.i64(b, "state"));
      x.start = r.list(b, "start");
      x.extent = r.list(b, "extent");
      x.offset = r.i64(b, "offset");
      x.bytes = r.i64(b, "bytes");
      if (x.state < 0 || x.state >= int(m.states.size()))
        r.fail("shard " + sh.file + " names state " + std::to_string(x.state));
      const StateRecord& st = m.states[size_t(x.state)];
      int64_t n = int64_t(core::dtype_size(st.dtype));
      bool ok = x.start.size() == st.shape.size() && x.extent.size() == st.shape.size();
      for (size_t d = 0; ok && d < st.shape.size(); ++d) {
        ok = x.start[d] >= 0 && x.extent[d] > 0 && x.start[d] + x.extent[d] <= st.shape[d];
        n *= x.extent[d];
      }
      if (!ok || x.bytes != n || x.offset < 0 || x.offset + x.bytes > sh.bytes)
        r.fail("shard " + sh.file + " has a box of " + st.name + " outside the tensor or the file");
      sh.boxes.push_back(std::move(x));
    }
    m.shards.push_back(std::move(sh));
  }
  // Last, so that a structurally broken file is named for what is broken; an edited value
  // that still parses (a box offset, the step) ends here.
  const uint32_t actual = canonical_crc(m);
  if (actual != stored)
    r.fail("metadata_crc32c is " + hex(stored).substr(8) + " but the metadata hashes to " +
           hex(actual).substr(8) + ": the file was edited or damaged after it was written");
  return m;
}

}  // namespace weft::checkpoint
