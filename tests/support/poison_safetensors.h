// Writes a NaN or an infinity into a real safetensors file in place, the way a diverged run's
// file would hold one: Weft's own writer refuses to write such a value.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace weft::test {

// Overwrites the first f32 of tensor `name` in the safetensors file `file` with `value`.
inline void poison_safetensors(const std::filesystem::path& file, const std::string& name,
                               float value) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  size_t at = header.find("\"" + name + "\"");
  ASSERT_NE(at, std::string::npos) << name << " is not in " << file;
  size_t off = header.find("\"data_offsets\"", at);
  ASSERT_NE(off, std::string::npos);
  off = header.find('[', off);
  uint64_t begin = std::stoull(header.substr(off + 1));
  f.seekp(std::streamoff(8 + n + begin));
  f.write(reinterpret_cast<const char*>(&value), 4);
  ASSERT_TRUE(f.good()) << "could not write " << file;
}

}  // namespace weft::test
