// Token files (round trip, truncation, magic, text, folders), batch offsets (the
// reference's sequential formula, shuffled permutations independent of who asks and
// how), the train/validation split and the vocabulary check.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "core/data/dataset.h"
#include "core/data/token_file.h"

namespace weft::core::data {
namespace {
namespace fs = std::filesystem;

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("weft_data_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
  fs::path dir_;
};

std::vector<int32_t> iota_tokens(int64_t n, int32_t mod = 256) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7 + 3) % mod);
  return t;
}

TEST_F(DataFiles, TokenFileRoundTrip) {
  std::vector<int32_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  write_token_file(path("t.bin"), tokens);
  EXPECT_EQ(fs::file_size(path("t.bin")), uint64_t(kTokenHeaderBytes + 2 * tokens.size()));
  std::ifstream in(path("t.bin"), std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], int32_t(tokens.size()));
  EXPECT_EQ(read_token_file(path("t.bin")), tokens);
  EXPECT_FALSE(fs::exists(path("t.bin.tmp")));
  EXPECT_THROW(write_token_file(path("u.bin"), {1, 65536}), IoError);
  EXPECT_THROW(write_token_file(path("u.bin"), {-1}), IoError);
}

TEST_F(DataFiles, TruncatedTokenFileSaysHowManyTokens) {
  write_token_file(path("t.bin"), iota_tokens(100));
  fs::resize_file(path("t.bin"), kTokenHeaderBytes + 2 * 90);
  try {
    read_token_file(path("t.bin"));
    FAIL() << "no error for a truncated file";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("expected 100 tokens, file holds 90"), std::string::npos) << m;
    EXPECT_NE(m.find(path("t.bin")), std::string::npos) << m;
  }
  // With a field, the same problem is a ConfigError naming the setting.
  try {
    read_token_file(path("t.bin"), "data.path");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.path");
  }
  fs::resize_file(path("t.bin"), 100);  // not even a header
  EXPECT_THROW(read_token_file(path("t.bin")), IoError);
}

TEST_F(DataFiles, BadMagicAndVersion) {
  write_token_file(path("t.bin"), iota_tokens(10));
  {
    std::fstream f(path("t.bin"), std::ios::in | std::ios::out | std::ios::binary);
    int32_t bad = 12345;
    f.write(reinterpret_cast<const char*>(&bad), 4);
  }
  try {
    read_token_file(path("t.bin"), "data.path");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.path");
    EXPECT_NE(std::string(e.what()).find("bad magic number 12345"), std::string::npos) << e.what();
  }
  write_token_file(path("v.bin"), iota_tokens(10));
  {
    std::fstream f(path("v.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    int32_t v = 2;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  EXPECT_THROW(read_token_file(path("v.bin")), IoError);
}

TEST_F(DataFiles, MissingFileNamesField) {
  try {
    read_token_file(path("none.bin"), "data.path");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.path");
    EXPECT_NE(std::string(e.what()).find("none.bin"), std::string::npos);
  }
  EXPECT_THROW(read_token_file(path("none.txt")), IoError);
}

// A FIFO or device would block the reader forever (or never end): refused by kind, naming
// the field, before anything opens it.
TEST_F(DataFiles, FifosAndDevicesAreRefused) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0600), 0);
  for (const auto& [p, kind] : {std::pair{path("pipe"), "a FIFO"},
                                std::pair{std::string("/dev/zero"), "a character device"}}) {
    for (const char* field : {"data.path", "data.val_path"}) {
      try {
        read_token_file(p, field);
        FAIL() << p;
      } catch (const ConfigError& e) {
        EXPECT_EQ(e.field(), field);
        std::string m = e.what();
        EXPECT_NE(m.find(std::string("is ") + kind), std::string::npos) << m;
        EXPECT_NE(m.find("not a regular file or folder"), std::string::npos) << m;
      }
    }
  }
  // In a folder, such entries are skipped like symlinks: the text beside them is read.
  write_text("a.txt", "hello");
  EXPECT_EQ(read_token_file(dir_.string()).size(), 5u);
}

TEST_F(DataFiles, TextAndFoldersReadAsBytes) {
  EXPECT_EQ(read_token_file(write_text("a.txt", std::string("hi\xff", 3))),
            (std::vector<int32_t>{'h', 'i', 255}));
  fs::create_directories(dir_ / "corpus" / "sub");
  write_text("corpus/b", "BB");
  write_text("corpus/a", "A");
  write_text("corpus/a.dat", "\x01\x02");  // fortunes' binary index: skipped
  write_text("corpus/sub/c", "C");         // not a regular file of the folder: skipped
  fs::create_symlink(dir_ / "corpus" / "a", dir_ / "corpus" / "a.u8");  // duplicate: skipped
  EXPECT_EQ(read_token_file(path("corpus")), (std::vector<int32_t>{'A', 'B', 'B'}));
  EXPECT_EQ(token_source_files(path("corpus")).size(), 2u);
  write_text("empty.txt", "");
  EXPECT_THROW(read_token_file(path("empty.txt")), IoError);
}

TEST(TokenVocab, TokenAtOrAboveVocabNamesBothFields) {
  check_tokens_fit_vocab({0, 255}, 256, "data.path", "x.bin");
  try {
    check_tokens_fit_vocab({1, 2, 300, 4}, 256, "data.path", "x.bin");
    FAIL();
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_EQ(e.field(), "model.vocab");
    EXPECT_NE(m.find("data.path"), std::string::npos) << m;
    EXPECT_NE(m.find("position 2"), std::string::npos) << m;
    EXPECT_NE(m.find("at least 301"), std::string::npos) << m;
  }
}

TEST(BatchSampler, SequentialMatchesReferenceFormula) {
  // N = 100 tokens, T = 8, B = 4: o = ((s*B + b) * T) mod (N - T) = (32s + 8b) mod 92.
  BatchSampler s(100, 8, 4, Order::kSequential, 1);
  EXPECT_EQ(s.offset(0, 0), 0);
  EXPECT_EQ(s.offset(0, 3), 24);
  EXPECT_EQ(s.offset(2, 3), 88);
  EXPECT_EQ(s.offset(3, 0), 4);   // 96 mod 92
  EXPECT_EQ(s.offset(5, 1), 76);  // 168 mod 92
  EXPECT_EQ(s.offset(100, 2), (400 + 2) * 8 % 92);
  EXPECT_EQ(s.epoch(2, 3), 0);
  EXPECT_EQ(s.epoch(3, 0), 1);
}

TEST(BatchSampler, ShuffledIsAPermutationOfWindowsPerEpoch) {
  // 81 tokens, T = 8: windows start at 0, 8, ..., 72 (W = 10); B = 5, 2 steps per epoch.
  BatchSampler s(81, 8, 5, Order::kShuffled, 1234);
  ASSERT_EQ(s.num_windows(), 10);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t step = 0; step < 4; ++step)
    for (int64_t b = 0; b < 5; ++b) (step < 2 ? epoch0 : epoch1).push_back(s.offset(step, b));
  for (const auto* ep : {&epoch0, &epoch1}) {
    std::vector<int64_t> sorted = *ep;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(sorted[size_t(k)], 8 * k);
  }
  EXPECT_NE(epoch0, epoch1);  // each epoch draws a new order
  std::vector<int64_t> identity(10);
  for (int64_t k = 0; k < 10; ++k) identity[size_t(k)] = 8 * k;
  EXPECT_NE(epoch0, identity);
  EXPECT_EQ(s.epoch(1, 4), 0);
  EXPECT_EQ(s.epoch(2, 0), 1);
}

TEST(BatchSampler, ShuffledIsIdenticalAcrossSamplersAndRequestOrders) {
  const int64_t N = 10007, T = 16, B = 6, steps = 300;  // 625 windows, ~3 epochs
  BatchSampler a(N, T, B, Order::kShuffled, 99), b(N, T, B, Order::kShuffled, 99);
  std::vector<int64_t> forward;
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t i = 0; i < B; ++i) forward.push_back(a.offset(s, i));
  // b is asked in a random order that keeps jumping between epochs.
  std::vector<int64_t> order(forward.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  for (int64_t g : order) ASSERT_EQ(b.offset(g / B, g % B), forward[size_t(g)]) << g;
  // A copy gives the same answers; another seed gives another order.
  BatchSampler c = a;
  EXPECT_EQ(c.offset(123, 4), forward[123 * B + 4]);
  BatchSampler d(N, T, B, Order::kShuffled, 100);
  int same = 0;
  for (int64_t i = 0; i < B * 10; ++i) same += d.offset(i / B, i % B) == forward[size_t(i)];
  EXPECT_LT(same, 10);
  // Window starts stay in bounds and aligned.
  for (int64_t o : forward) {
    EXPECT_EQ(o % T, 0);
    EXPECT_LE(o + T + 1, N);
  }
}

TEST(TokenDataset, MicroBatchesConcatenateToTheGlobalBatch) {
  std::vector<int32_t> tokens = iota_tokens(1000);
  for (Order order : {Order::kSequential, Order::kShuffled}) {
    TokenDataset ds(tokens, {}, 16, 8, order, 3, 2);
    std::vector<int32_t> x(8 * 16), y(8 * 16), x2(8 * 16), y2(8 * 16);
    ds.fill_train(7, 0, 8, x.data(), y.data());
    for (int64_t j = 0; j < 4; ++j)  // 4 micro-batches of 2, as 4 ranks would read them
      ds.fill_train(7, j * 2, 2, x2.data() + j * 32, y2.data() + j * 32);
    EXPECT_EQ(x, x2);
    EXPECT_EQ(y, y2);
    for (int64_t b = 0; b < 8; ++b) {
      int64_t o = ds.sampler().offset(7, b);
      for (int64_t t = 0; t < 16; ++t) {
        EXPECT_EQ(x[size_t(b * 16 + t)], tokens[size_t(o + t)]);
        EXPECT_EQ(y[size_t(b * 16 + t)], tokens[size_t(o + t + 1)]);
      }
    }
  }
}

TEST_F(DataFiles, LoadSplitsValidationOnlyWhenEvaluating) {
  std::vector<int32_t> tokens = iota_tokens(1000, 200);
  write_token_file(path("t.bin"), tokens);
  JobSpec spec;
  spec.data.path = path("t.bin");
  spec.data.val_fraction = 0.1;
  spec.model.seq_len = 16;
  TokenDataset no_eval = TokenDataset::load(spec);
  EXPECT_EQ(no_eval.train_tokens(), tokens);  // every token trains, as in shared/reference
  EXPECT_FALSE(no_eval.has_val());

  spec.train.eval_every = 10;
  spec.train.eval_batches = 3;
  TokenDataset ds = TokenDataset::load(spec);
  ASSERT_EQ(ds.train_tokens().size(), 900u);
  ASSERT_EQ(ds.val_tokens().size(), 100u);
  EXPECT_EQ(ds.val_tokens()[0], tokens[900]);
  EXPECT_EQ(ds.num_val_batches(), 3);
  std::set<int64_t> starts;
  for (int64_t k = 0; k < 3; ++k)
    for (int64_t b = 0; b < spec.train.global_batch; ++b) {
      int64_t o = ds.val_offset(k, b);
      EXPECT_GE(o, 0);
      EXPECT_LE(o + 16 + 1, 100);
      starts.insert(o);
    }
  EXPECT_GT(starts.size(), 12u);  // spread out, not one window repeated
  std::vector<int32_t> x(16), y(16);
  ds.fill_val(2, 5, 1, x.data(), y.data());
  EXPECT_EQ(x[0], ds.val_tokens()[size_t(ds.val_offset(2, 5))]);
  EXPECT_EQ(y[15], ds.val_tokens()[size_t(ds.val_offset(2, 5) + 16)]);

  spec.data.val_path = write_text("val.txt", std::string(40, 'v'));
  TokenDataset with_file = TokenDataset::load(spec);
  EXPECT_EQ(with_file.train_tokens().size(), 1000u);
  EXPECT_EQ(with_file.val_tokens().size(), 40u);

  spec.model.vocab = 100;  // iota_tokens(.., 200) holds tokens up to 199
  try {
    TokenDataset::load(spec);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "model.vocab");
    EXPECT_NE(std::string(e.what()).find("data.path"), std::string::npos);
  }
}

TEST_F(DataFiles, LoadRejectsTooLittleData) {
  write_token_file(path("t.bin"), iota_tokens(20));
  JobSpec spec;
  spec.data.path = path("t.bin");
  spec.model.seq_len = 32;
  try {
    TokenDataset::load(spec);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.path");
  }
  spec.model.seq_len = 8;
  spec.train.eval_every = 1;
  spec.data.val_fraction = 0.2;  // 4 tokens: less than one validation sequence
  try {
    TokenDataset::load(spec);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.val_fraction");
  }
}

TEST(TokenDataset, ReadsTheReferenceTokens) {
  std::vector<int32_t> t =
      read_token_file(std::string(WEFT_REFERENCE_DIR) + "/gpt-tiny/tokens.bin");
  EXPECT_EQ(t.size(), 200000u);
  EXPECT_LT(*std::max_element(t.begin(), t.end()), 256);
}

}  // namespace
}  // namespace weft::core::data
