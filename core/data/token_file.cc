// Reading and writing token files; text and folders of text as byte tokens.
#include "core/data/token_file.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace weft::core::data {
namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; add byte swapping for this host");

namespace {

[[noreturn]] void fail(const std::string& field, const std::string& path, const std::string& msg) {
  if (field.empty()) throw IoError("'" + path + "': " + msg);
  throw ConfigError(field, "'" + path + "': " + msg);
}

std::string read_all(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(field, path, "cannot open for reading: " + std::string(std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(field, path, "read error");
  return bytes;
}

const char* kind_of(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::fifo:
      return "a FIFO (named pipe)";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::character:
      return "a character device";
    default:
      return "a special file";
  }
}

bool is_token_file_name(const std::string& path) { return fs::path(path).extension() == ".bin"; }

std::vector<int32_t> parse_token_file(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(field, path, "cannot open for reading: " + std::string(std::strerror(errno)));
  const int64_t size = int64_t(fs::file_size(path));
  if (size < kTokenHeaderBytes)
    fail(field, path,
         "is " + std::to_string(size) + " bytes, shorter than the " +
             std::to_string(kTokenHeaderBytes) + "-byte header of a token file");
  int32_t header[kTokenHeaderInts];
  in.read(reinterpret_cast<char*>(header), kTokenHeaderBytes);
  if (header[0] != kTokenFileMagic)
    fail(field, path,
         "bad magic number " + std::to_string(header[0]) + " (expected " +
             std::to_string(kTokenFileMagic) +
             "): not an llm.c token file; for text use a .txt path or run "
             "`weft data prepare IN.txt OUT.bin`");
  if (header[1] != kTokenFileVersion)
    fail(field, path,
         "token file version " + std::to_string(header[1]) + " is not supported (expected " +
             std::to_string(kTokenFileVersion) + ": uint16 tokens)");
  const int64_t expected = header[2];
  const int64_t held = (size - kTokenHeaderBytes) / 2;
  if (expected < 0 || held != expected || (size - kTokenHeaderBytes) % 2 != 0)
    fail(field, path,
         std::string(held < expected ? "truncated" : "corrupt") + ": expected " +
             std::to_string(expected) + " tokens, file holds " + std::to_string(held) +
             ((size - kTokenHeaderBytes) % 2 ? " and a half" : ""));
  std::vector<uint16_t> raw(static_cast<size_t>(expected));
  in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(expected * 2));
  if (in.gcount() != std::streamsize(expected * 2)) fail(field, path, "read error");
  return std::vector<int32_t>(raw.begin(), raw.end());
}

}  // namespace

std::vector<std::string> token_source_files(const std::string& path, const std::string& field) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(field, path, "no such file or folder");
  // A FIFO, socket or device would block or never end: only files and folders are data.
  if (!fs::is_directory(st) && !fs::is_regular_file(st))
    fail(field, path,
         std::string("is ") + kind_of(st) +
             ", not a regular file or folder; give a token file (.bin), a text file or a "
             "folder of text files");
  if (!fs::is_directory(st)) return {path};
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path)) {
    // Symlinks duplicate other files (fortunes' *.u8 -> text); *.dat are binary indexes.
    if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) fail(field, path, "the folder holds no regular text files");
  return files;
}

std::vector<int32_t> read_token_file(const std::string& path, const std::string& field) {
  std::vector<std::string> files = token_source_files(path, field);
  if (files.size() == 1 && files[0] == path && is_token_file_name(path))
    return parse_token_file(path, field);
  std::vector<int32_t> tokens;
  for (const std::string& f : files) {
    std::string bytes = read_all(f, field);
    tokens.insert(tokens.end(), reinterpret_cast<const unsigned char*>(bytes.data()),
                  reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
  }
  if (tokens.empty()) fail(field, path, "is empty: no text to train on");
  return tokens;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  if (tokens.size() > size_t(INT32_MAX))
    throw IoError("'" + path + "': " + std::to_string(tokens.size()) +
                  " tokens do not fit one token file (at most 2^31 - 1); split them into shards");
  std::vector<uint16_t> raw(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 65535)
      throw IoError("'" + path + "': token " + std::to_string(tokens[i]) + " at position " +
                    std::to_string(i) + " does not fit the file's uint16 tokens");
    raw[i] = uint16_t(tokens[i]);
  }
  int32_t header[kTokenHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = int32_t(tokens.size());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError("'" + tmp + "': cannot open for writing: " + std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header), kTokenHeaderBytes);
    out.write(reinterpret_cast<const char*>(raw.data()), std::streamsize(raw.size() * 2));
    out.flush();
    if (!out) throw IoError("'" + tmp + "': write failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IoError("'" + path + "': cannot move " + tmp + " into place: " + ec.message());
}

void check_tokens_fit_vocab(const std::vector<int32_t>& tokens, int64_t vocab,
                            const std::string& field, const std::string& path) {
  auto bad = std::find_if(tokens.begin(), tokens.end(),
                          [vocab](int32_t t) { return t < 0 || t >= vocab; });
  if (bad == tokens.end()) return;
  int32_t max_token = *std::max_element(tokens.begin(), tokens.end());
  throw ConfigError("model.vocab", field + " '" + path + "' holds token " + std::to_string(*bad) +
                                       " at position " + std::to_string(bad - tokens.begin()) +
                                       " but model.vocab is " + std::to_string(vocab) +
                                       "; set model.vocab to at least " +
                                       std::to_string(int64_t(max_token) + 1) +
                                       " or use data made for this vocabulary");
}

}  // namespace weft::core::data
