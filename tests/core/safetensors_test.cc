// safetensors: round trip of every supported dtype, the reference's initial weights, and
// each way a file can be broken (truncated, bad JSON, offsets out of range, bad dtype).
#include "core/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace weft::core::io {
namespace {
namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("weft_st_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // A file with the given JSON header and `data_bytes` zero bytes after it.
  std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes) {
    std::ofstream out(path(name), std::ios::binary);
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
    return path(name);
  }
  // The IoError message of loading `p`, or "" when it loads.
  std::string load_error(const std::string& p) {
    try {
      load_safetensors(p);
    } catch (const IoError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  std::map<std::string, Tensor> t;
  t["f32"] = Tensor::from_vector<float>({2, 3}, {1.5f, -2, 3e-8f, 4, 5, -6});
  t["f64"] = Tensor::from_vector<double>({3}, {1.0 / 3, -1e300, 2});
  t["bf16"] = Tensor::from_vector<bf16>({2}, {float_to_bf16(1.0f), float_to_bf16(-3.5f)});
  t["scalar"] = Tensor::from_vector<float>({}, {42.f});
  t["empty"] = Tensor::empty({0, 4}, DType::kF32);
  // A non-contiguous view (a column) is written as its contiguous values.
  t["column"] = Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6}).slice(1, 1, 1);
  save_safetensors(path("w.safetensors"), t, {{"seed", "7"}, {"note", "a \"quoted\" value"}});
  EXPECT_FALSE(fs::exists(path("w.safetensors.tmp")));

  std::map<std::string, std::string> meta;
  auto back = load_safetensors(path("w.safetensors"), "", &meta);
  EXPECT_EQ(meta.at("seed"), "7");
  EXPECT_EQ(meta.at("note"), "a \"quoted\" value");
  ASSERT_EQ(back.size(), t.size());
  EXPECT_EQ(back.at("f32").to_vector<float>(), t["f32"].to_vector<float>());
  EXPECT_EQ(back.at("f32").shape(), (Shape{2, 3}));
  EXPECT_EQ(back.at("f64").to_vector<double>(), t["f64"].to_vector<double>());
  EXPECT_EQ(back.at("bf16").dtype(), DType::kBF16);
  EXPECT_EQ(bf16_to_float(back.at("bf16").data<bf16>()[1]), -3.5f);
  EXPECT_EQ(back.at("scalar").shape(), Shape{});
  EXPECT_EQ(back.at("scalar").item(), 42.0);
  EXPECT_EQ(back.at("empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(back.at("column").to_vector<float>(), (std::vector<float>{2, 4, 6}));

  // The data section starts 8-byte aligned, as PyTorch's writer does.
  SafetensorsHeader h = read_safetensors_header(path("w.safetensors"));
  EXPECT_EQ(h.data_start % 8, 0u);
  EXPECT_EQ(h.tensors.size(), t.size());
}

TEST_F(Safetensors, ReadsTheReferenceInitialWeights) {
  const std::string p = std::string(WEFT_REFERENCE_DIR) + "/gpt-tiny/init.safetensors";
  std::map<std::string, std::string> meta;
  auto w = load_safetensors(p, "", &meta);
  EXPECT_EQ(w.size(), 28u);  // wte, wpe, ln_f.{w,b} and 12 tensors per layer x 2
  const Tensor& wte = w.at("wte.weight");
  EXPECT_EQ(wte.shape(), (Shape{256, 64}));
  EXPECT_EQ(wte.dtype(), DType::kF32);
  // The first values, as Python's struct module reads them from the file.
  EXPECT_FLOAT_EQ(wte.data<float>()[0], -0.0017662015743553638f);
  EXPECT_FLOAT_EQ(wte.data<float>()[2], 0.00822336133569479f);
  EXPECT_EQ(w.at("wpe.weight").shape(), (Shape{32, 64}));
  EXPECT_EQ(w.at("h.1.attn.qkv.weight").shape(), (Shape{192, 64}));
  EXPECT_EQ(meta.at("seed"), "1234");
  for (const auto& [name, t] : w)
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(t.item_at(i))) << name;
}

TEST_F(Safetensors, TruncatedFileNamesPath) {
  save_safetensors(path("w.safetensors"), {{"a", Tensor::from_vector<float>({4}, {1, 2, 3, 4})}});
  fs::resize_file(path("w.safetensors"), fs::file_size(path("w.safetensors")) - 4);
  std::string m = load_error(path("w.safetensors"));
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  EXPECT_NE(m.find(path("w.safetensors")), std::string::npos) << m;
  fs::resize_file(path("w.safetensors"), 20);  // cut inside the header
  EXPECT_NE(load_error(path("w.safetensors")).find("header length"), std::string::npos);
  fs::resize_file(path("w.safetensors"), 3);
  EXPECT_NE(load_error(path("w.safetensors")).find("too short"), std::string::npos);
}

TEST_F(Safetensors, MissingFileWithFieldIsConfigError) {
  EXPECT_NE(load_error(path("none.safetensors")).find("no such file"), std::string::npos);
  try {
    load_safetensors(path("none.safetensors"), "--init-weights");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--init-weights");
  }
}

TEST_F(Safetensors, BadHeadersAreRejectedWithReasons) {
  EXPECT_NE(load_error(raw_file("a", "{\"x\": {\"dtype\": ", 0)).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(load_error(raw_file("b", "[1, 2]", 0)).find("not a JSON object"), std::string::npos);
  // Offsets past the data.
  std::string m = load_error(
      raw_file("c", R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8));
  EXPECT_NE(m.find("tensor 'x' ends at byte 16"), std::string::npos) << m;
  // Offsets that disagree with the shape.
  m = load_error(
      raw_file("d", R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}})", 8));
  EXPECT_NE(m.find("needs 16"), std::string::npos) << m;
  m = load_error(
      raw_file("e", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 8));
  EXPECT_NE(m.find("begin <= end"), std::string::npos) << m;
  // Overlapping tensors.
  m = load_error(raw_file("f", R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                          16));
  EXPECT_NE(m.find("overlap"), std::string::npos) << m;
  // A dtype Weft does not read, named with its tensor: integers are never converted to
  // weights (U8 used to load as floats 0..255).
  m = load_error(
      raw_file("g", R"({"x": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", 4));
  EXPECT_NE(m.find("tensor 'x': dtype F16 is not supported"), std::string::npos) << m;
  for (const char* dt : {"U8", "I32", "I64", "BOOL"}) {
    m = load_error(raw_file("u",
                            std::string(R"({"w.weight": {"dtype": ")") + dt +
                                R"(", "shape": [4], "data_offsets": [0, 4]}})",
                            4));
    EXPECT_NE(m.find("tensor 'w.weight': dtype " + std::string(dt) + " is not supported"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("F32, BF16, F64"), std::string::npos) << m;
  }
  // A header length beyond the file.
  std::ofstream(path("h"), std::ios::binary)
      << std::string("\xff\xff\xff\x00\x00\x00\x00\x00{}", 10);
  EXPECT_NE(load_error(path("h")).find("header length"), std::string::npos);
  // A gap between tensors, bytes before the first, bytes after the last.
  m = load_error(raw_file("i", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                          12));
  EXPECT_NE(m.find("no tensor holds data bytes [4, 8) before tensor 'y'"), std::string::npos) << m;
  m = load_error(
      raw_file("j", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8));
  EXPECT_NE(m.find("no tensor holds data bytes [0, 4)"), std::string::npos) << m;
  m = load_error(
      raw_file("k", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8));
  EXPECT_NE(m.find("the tensors hold 4 data bytes but the file has 8"), std::string::npos) << m;
  // Anything but padding spaces after the object, or before it.
  m = load_error(
      raw_file("l", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}} x)", 4));
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  m = load_error(raw_file("m", "{}\n  ", 0));
  EXPECT_NE(m.find("not a JSON object of tensors filling its"), std::string::npos) << m;
  m = load_error(raw_file("n", " {}", 0));
  EXPECT_NE(m.find("not a JSON object of tensors filling its"), std::string::npos) << m;
  // Zero-size tensors tile trivially; padding spaces are fine.
  EXPECT_EQ(
      load_error(raw_file("o",
                          R"({"e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, )"
                          R"("x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}    )",
                          4)),
      "");
}

// The writer pads the header with spaces to 8 bytes. A file whose declared header length
// leaves the padding out used to load every tensor shifted by the padding (and train to
// NaN); the data section then has bytes no tensor covers.
TEST_F(Safetensors, HeaderLengthWithoutItsPaddingIsRefused) {
  const std::string p = path("w.safetensors");
  save_safetensors(p, {{"wte.weight", Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4})}});
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const uint64_t unpadded = header.find_last_of('}') + 1;
  ASSERT_LT(unpadded, n) << "the writer added no padding to this header: pick another name";
  f.seekp(0);
  f.write(reinterpret_cast<const char*>(&unpadded), 8);
  f.close();
  std::string m = load_error(p);
  EXPECT_NE(m.find("the header length is wrong"), std::string::npos) << m;
  try {
    load_safetensors(p, "--init-weights");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--init-weights");
  }
}

TEST_F(Safetensors, WriterRefusesNonFiniteValuesAndNonWeightDtypes) {
  const std::string p = path("w.safetensors");
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::map<std::string, Tensor> t;
    t["a.weight"] = Tensor::from_vector<float>({2}, {1, 2});
    t["h.0.mlp.fc.weight"] = Tensor::from_vector<float>({3}, {1, bad, 3});
    try {
      save_safetensors(p, t);
      FAIL() << "wrote " << bad;
    } catch (const IoError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("tensor 'h.0.mlp.fc.weight' holds a NaN or infinity (element 1)"),
                std::string::npos)
          << m;
    }
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  }
  // bf16 and f64 are checked too.
  EXPECT_THROW(save_safetensors(p, {{"b", Tensor::from_vector<double>({1}, {NAN})}}), IoError);
  EXPECT_THROW(
      save_safetensors(p, {{"b", Tensor::from_vector<bf16>({1}, {float_to_bf16(INFINITY)})}}),
      IoError);
  // A dtype the reader would refuse is not written either.
  try {
    save_safetensors(p, {{"steps", Tensor::from_vector<int64_t>({1}, {3})}});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'steps' is"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(p));
}

}  // namespace
}  // namespace weft::core::io
