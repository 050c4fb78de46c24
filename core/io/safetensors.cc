// Reading and writing safetensors; the header is parsed with core/io/json and checked
// before any tensor byte is read, so a corrupt file fails with a message, not a crash.
#include "core/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/error.h"
#include "core/io/json.h"

namespace weft::core::io {
namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; add byte swapping for this host");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void fail(const std::string& field, const std::string& path, const std::string& msg) {
  if (field.empty()) throw IoError("'" + path + "': " + msg);
  throw ConfigError(field, "'" + path + "': " + msg);
}

// The dtypes a weights file may hold (safetensors.h); the others are refused, not converted.
constexpr DType kWeightDtypes[] = {DType::kF32, DType::kBF16, DType::kF64};
constexpr const char* kWeightDtypeList = "F32, BF16, F64";

bool is_weight_dtype(DType t) {
  return std::find(std::begin(kWeightDtypes), std::end(kWeightDtypes), t) !=
         std::end(kWeightDtypes);
}

bool parse_dtype_name(const std::string& s, DType& out) {
  for (DType t : kWeightDtypes)
    if (s == safetensors_dtype_name(t)) {
      out = t;
      return true;
    }
  return false;
}

SafetensorsEntry parse_entry(const std::string& name, const JsonValue& v, const std::string& field,
                             const std::string& path) {
  auto bad = [&](const std::string& what) { fail(field, path, "tensor '" + name + "': " + what); };
  if (v.kind != JsonValue::Kind::kObject) bad("expected an object with dtype, shape, data_offsets");
  SafetensorsEntry e;
  e.name = name;
  const JsonValue* dtype = v.find("dtype");
  if (!dtype || dtype->kind != JsonValue::Kind::kString) bad("missing string 'dtype'");
  if (!parse_dtype_name(dtype->text, e.dtype))
    bad("dtype " + dtype->text + " is not supported: weights files hold " + kWeightDtypeList +
        "; convert the tensor to float32 (tensor.float() in PyTorch)");
  const JsonValue* shape = v.find("shape");
  if (!shape || shape->kind != JsonValue::Kind::kArray) bad("missing array 'shape'");
  uint64_t numel = 1;
  for (const JsonValue& d : shape->items) {
    int64_t n;
    if (!d.as_int64(n) || n < 0) bad("shape entries must be non-negative integers");
    e.shape.push_back(n);
    if (n != 0 && numel > (uint64_t(1) << 62) / uint64_t(n)) bad("shape too large");
    numel *= uint64_t(n);
  }
  const JsonValue* off = v.find("data_offsets");
  int64_t b, en;
  if (!off || off->kind != JsonValue::Kind::kArray || off->items.size() != 2 ||
      !off->items[0].as_int64(b) || !off->items[1].as_int64(en) || b < 0 || en < b)
    bad("'data_offsets' must be [begin, end] with 0 <= begin <= end");
  e.begin = uint64_t(b);
  e.end = uint64_t(en);
  if (e.end - e.begin != numel * dtype_size(e.dtype))
    bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + ") hold " +
        std::to_string(e.end - e.begin) + " bytes, but shape " + shape_str(e.shape) + " of " +
        dtype->text + " needs " + std::to_string(numel * dtype_size(e.dtype)));
  return e;
}

// Index of the first NaN or infinity in `t` (contiguous, a weight dtype), or -1.
int64_t first_non_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.dtype() == DType::kF32   ? double(t.data<float>()[i])
               : t.dtype() == DType::kF64 ? t.data<double>()[i]
                                          : double(bf16_to_float(t.data<bf16>()[i]));
    if (!std::isfinite(v)) return i;
  }
  return -1;
}

// Everything save_safetensors refuses, checked for every tensor before the file is opened.
void check_writable(const std::string& path, const std::string& name, const Tensor& t) {
  if (name == "__metadata__") throw IoError("'" + path + "': '__metadata__' is reserved");
  if (!t.defined()) throw IoError("'" + path + "': tensor '" + name + "' is undefined");
  if (!t.device().is_cpu())
    throw NotSupported("save_safetensors('" + path + "'): tensor '" + name +
                       "' is not in host memory; copy it to the host first");
  if (!is_weight_dtype(t.dtype()))
    throw IoError("'" + path + "': tensor '" + name + "' is " + dtype_name(t.dtype()) +
                  "; weights files hold " + kWeightDtypeList);
  if (int64_t i = first_non_finite(t.contiguous()); i >= 0)
    throw IoError("'" + path + "': tensor '" + name + "' holds a NaN or infinity (element " +
                  std::to_string(i) +
                  "): the weights diverged; nothing was written. Lower train.lr or set "
                  "train.grad_clip, and train from an earlier checkpoint");
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

SafetensorsHeader read_safetensors_header(const std::string& path, const std::string& field) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(field, path, "no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(field, path, "cannot open for reading: " + std::string(std::strerror(errno)));
  SafetensorsHeader h;
  h.file_size = fs::file_size(path);
  if (h.file_size < 8)
    fail(field, path,
         "is " + std::to_string(h.file_size) +
             " bytes: too short for a safetensors file (truncated?)");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > kMaxHeaderBytes || n > h.file_size - 8)
    fail(field, path,
         "header length " + std::to_string(n) + " runs past the end of the " +
             std::to_string(h.file_size) + "-byte file: truncated, or not a safetensors file");
  std::string json(n, '\0');
  in.read(json.data(), std::streamsize(n));
  if (!in) fail(field, path, "read error in the header");
  // One object from the first byte, then nothing but the writer's padding spaces.
  const size_t end = json.find_last_not_of(' ') + 1;  // npos + 1 == 0: all spaces
  JsonValue root;
  try {
    root = parse_json(std::string_view(json).substr(0, end), "header");
  } catch (const IoError& e) {
    fail(field, path,
         std::string(e.what()) + " (is the header length of " + std::to_string(n) +
             " bytes right?)");
  }
  if (root.kind != JsonValue::Kind::kObject || json[0] != '{' || json[end - 1] != '}')
    fail(field, path,
         "header is not a JSON object of tensors filling its " + std::to_string(n) +
             " bytes but for trailing padding spaces");
  h.data_start = 8 + n;
  const uint64_t data_bytes = h.file_size - h.data_start;
  for (const auto& [name, v] : root.members) {
    if (name == "__metadata__") {
      if (v.kind != JsonValue::Kind::kObject) fail(field, path, "__metadata__ is not an object");
      for (const auto& [k, s] : v.members) {
        if (s.kind != JsonValue::Kind::kString)
          fail(field, path, "__metadata__ value of '" + k + "' is not a string");
        h.metadata[k] = s.text;
      }
      continue;
    }
    SafetensorsEntry e = parse_entry(name, v, field, path);
    if (e.end > data_bytes)
      fail(field, path,
           "tensor '" + name + "' ends at byte " + std::to_string(e.end) +
               " of the data, but the file holds " + std::to_string(data_bytes) +
               " data bytes (truncated?)");
    h.tensors.push_back(std::move(e));
  }
  // The byte ranges must tile [0, data_bytes): a header length off by the padding would
  // otherwise read every tensor shifted by a few bytes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : h.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < covered)
      fail(field, path, "tensors '" + prev->name + "' and '" + e->name + "' overlap");
    if (e->begin > covered)
      fail(field, path,
           "no tensor holds data bytes [" + std::to_string(covered) + ", " +
               std::to_string(e->begin) + ") before tensor '" + e->name +
               "': the data offsets must cover the data section without gaps");
    covered = e->end;
    prev = e;
  }
  if (covered != data_bytes)
    fail(field, path,
         "the tensors hold " + std::to_string(covered) + " data bytes but the file has " +
             std::to_string(data_bytes) + " after the " + std::to_string(n) +
             "-byte header: the header length is wrong (padding left out of it?) or the file "
             "has trailing bytes");
  return h;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, const std::string& field,
                                               std::map<std::string, std::string>* metadata) {
  SafetensorsHeader h = read_safetensors_header(path, field);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(field, path, "cannot open for reading: " + std::string(std::strerror(errno)));
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : h.tensors) {
    Tensor t = Tensor::empty(e.shape, e.dtype, nullptr, memory::Tag::kParameter);
    in.seekg(std::streamoff(h.data_start + e.begin));
    in.read(static_cast<char*>(t.raw_data()), std::streamsize(e.end - e.begin));
    if (!in) fail(field, path, "read error in tensor '" + e.name + "'");
    out.emplace(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(h.metadata);
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += std::string(first ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      first = false;
    }
    header += "}";
  }
  for (const auto& [name, t] : tensors) check_writable(path, name, t);
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::string shape;
    for (int64_t d : t.shape()) shape += std::string(shape.empty() ? "" : ",") + std::to_string(d);
    header += std::string(header.size() > 1 ? "," : "") + json_quote(name) + ":{\"dtype\":\"" +
              safetensors_dtype_name(t.dtype()) + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
  }
  header += "}";
  // Pad with spaces (valid JSON whitespace) so the data starts 8-byte aligned, as the
  // reference writer does: readers can then map tensors in place.
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError("'" + tmp + "': cannot open for writing: " + std::strerror(errno));
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(header.data(), std::streamsize(n));
    for (const auto& [name, t] : tensors) {
      Tensor c = t.contiguous();
      out.write(static_cast<const char*>(c.raw_data()), std::streamsize(c.nbytes()));
    }
    out.flush();
    if (!out) throw IoError("'" + tmp + "': write failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IoError("'" + path + "': cannot move " + tmp + " into place: " + ec.message());
}

}  // namespace weft::core::io
