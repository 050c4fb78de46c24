// Loading: find the step folder, check the model, and fill any layout's boxes from the
// stored boxes by the router's cover (the same intersection code a live reshard uses),
// reading only the rows needed and verifying every block read.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/retention.h"
#include "parallel/router.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& msg) {
  if (!field.empty()) throw ConfigError(field, msg);
  throw IoError(msg);
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Reads byte ranges of one shard file, verifying each block it touches against the
// metadata before any of its bytes are used. Verified blocks are kept up to a cap.
class ShardReader {
 public:
  ShardReader(std::string path, const ShardRecord& rec, int64_t block, std::string field)
      : path_(std::move(path)), rec_(rec), block_(block), field_(std::move(field)) {
    fd_ = ::open(path_.c_str(), O_RDONLY);
    if (fd_ < 0)
      bad(field_, "checkpoint shard " + path_ + " cannot be opened: " + std::strerror(errno));
    off_t size = ::lseek(fd_, 0, SEEK_END);
    if (size != off_t(rec_.bytes))
      bad(field_, "checkpoint shard " + path_ + " is " + std::to_string(size) +
                      " bytes, the metadata says " + std::to_string(rec_.bytes) +
                      ": it is truncated or was replaced");
  }
  ~ShardReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  void read(int64_t lo, int64_t hi, uint8_t* out) {
    for (int64_t b = lo / block_; b * block_ < hi; ++b) {
      const std::vector<uint8_t>& data = block(b);
      int64_t from = std::max(lo, b * block_), to = std::min(hi, b * block_ + int64_t(data.size()));
      std::memcpy(out + (from - lo), data.data() + (from - b * block_), size_t(to - from));
    }
  }
  int64_t bytes_read() const { return bytes_read_; }

 private:
  const std::vector<uint8_t>& block(int64_t b) {
    auto it = cache_.find(b);
    if (it != cache_.end()) return it->second;
    if (cached_ > (int64_t(64) << 20)) cache_.clear(), cached_ = 0;
    int64_t begin = b * block_, n = std::min(block_, rec_.bytes - begin);
    std::vector<uint8_t> data(static_cast<size_t>(n));
    for (int64_t done = 0; done < n;) {
      ssize_t r = ::pread(fd_, data.data() + done, size_t(n - done), off_t(begin + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        bad(field_, "checkpoint shard " + path_ + " cannot be read at byte " +
                        std::to_string(begin + done));
      done += r;
    }
    bytes_read_ += n;
    uint32_t c = crc32c(data.data(), data.size());
    if (c != rec_.block_crc32c.at(size_t(b)))
      bad(field_, "checkpoint shard " + path_ + " is corrupted: bytes [" + std::to_string(begin) +
                      ", " + std::to_string(begin + n) + ") have crc32c " + hex32(c) +
                      ", the metadata says " + hex32(rec_.block_crc32c[size_t(b)]));
    cached_ += n;
    return cache_.emplace(b, std::move(data)).first->second;
  }

  std::string path_;
  const ShardRecord& rec_;
  int64_t block_;
  std::string field_;
  int fd_ = -1;
  std::map<int64_t, std::vector<uint8_t>> cache_;
  int64_t cached_ = 0, bytes_read_ = 0;
};

}  // namespace

std::string resolve_checkpoint(const std::string& path, const std::string& field) {
  if (fs::exists(fs::path(path) / kMetadataFile)) return path;
  if (!fs::is_directory(path))
    throw ConfigError(field, "checkpoint folder " + path + " does not exist");
  std::vector<std::string> all = list_checkpoints(path);
  if (all.empty())
    throw ConfigError(field, path + " holds no committed checkpoint (no step-*/" + kMetadataFile +
                                 "); name a checkpoint folder written by checkpoint.dir");
  return all.back();
}

Metadata read_metadata(const std::string& step_dir, const std::string& field) {
  const std::string p = (fs::path(step_dir) / kMetadataFile).string();
  std::ifstream in(p, std::ios::binary);
  if (!in) throw ConfigError(field, "cannot read " + p);
  std::stringstream ss;
  ss << in.rdbuf();
  Metadata m;
  try {
    m = metadata_from_json(ss.str(), p);
  } catch (const IoError& e) {
    throw ConfigError(field, std::string("checkpoint metadata refused: ") + e.what());
  }
  // The folder's name is part of what a checkpoint claims: a copied or renamed step folder
  // would otherwise be taken for a newer checkpoint than it is.
  const int64_t folder_step = step_of_folder(step_dir);
  if (folder_step >= 0 && folder_step != m.step)
    throw ConfigError(field, "checkpoint metadata refused: " + p + " says step " +
                                 std::to_string(m.step) + " but its folder is " +
                                 step_name(folder_step) +
                                 ": a renamed or copied folder; give it back its name " +
                                 step_name(m.step) + " or remove it");
  return m;
}

void check_model(const Metadata& m, const core::JobSpec& spec, const std::string& field) {
  uint64_t h = core::model_config_hash(spec.model);
  if (h == m.model_hash) return;
  char a[20], b[20];
  std::snprintf(a, sizeof a, "%016llx", (unsigned long long)m.model_hash);
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)h);
  throw ConfigError(field, "the checkpoint is of another model: it holds " + m.model +
                               " (model hash " + a + "), this job's model is " + spec.model.arch +
                               ", " + std::to_string(spec.model.layers) + " layers, dim " +
                               std::to_string(spec.model.dim) + ", heads " +
                               std::to_string(spec.model.heads) + ", vocab " +
                               std::to_string(spec.model.vocab) + " (model hash " + b +
                               "); resume with the model section it was trained with");
}

int64_t load_checkpoint(const std::string& step_dir, const Metadata& m,
                        const parallel::StateSpace& space, const parallel::Layout& layout, int rank,
                        std::vector<core::Tensor>& locals, const std::string& field) {
  using parallel::StateBox;
  const parallel::RankLayout& mine = layout.ranks.at(size_t(rank));
  if (locals.size() != mine.locals.size())
    throw InternalError("load_checkpoint: " + std::to_string(locals.size()) + " tensors for " +
                        std::to_string(mine.locals.size()) + " local tensors");
  // The stored boxes as a layout: shard i is "rank" i, each box its own local tensor.
  std::vector<int> space_of(m.states.size(), -1);
  for (size_t i = 0; i < m.states.size(); ++i) {
    int id = space.find(m.states[i].name);
    if (id < 0) continue;
    const parallel::StateTensor& t = space.at(id);
    if (t.shape != m.states[i].shape || t.dtype != m.states[i].dtype)
      bad(field, "checkpoint state " + t.name + " is " + core::dtype_name(m.states[i].dtype) +
                     core::shape_str(m.states[i].shape) + ", this job needs " +
                     core::dtype_name(t.dtype) + core::shape_str(t.shape));
    space_of[i] = id;
  }
  parallel::Layout stored;
  for (const ShardRecord& sh : m.shards) {
    parallel::RankLayout r;
    for (const BoxRecord& b : sh.boxes) {
      int id = space_of[size_t(b.state)];
      r.locals.push_back(parallel::LocalTensor{id, b.extent, m.states[size_t(b.state)].dtype, -1});
      if (id >= 0)
        r.boxes.push_back(StateBox{id, b.start, b.extent, int(r.locals.size()) - 1,
                                   std::vector<int64_t>(b.extent.size(), 0)});
    }
    stored.ranks.push_back(std::move(r));
  }
  // The destination: this rank's tensor boxes (scalars come from the metadata).
  parallel::Layout want;
  want.ranks.resize(size_t(rank) + 1);
  want.ranks[size_t(rank)].locals = mine.locals;
  for (const StateBox& b : mine.boxes) {
    const parallel::StateTensor& t = space.at(b.state);
    if (t.kind != parallel::StateKind::kScalar) {
      if (m.find_state(t.name) < 0)
        bad(field, "the checkpoint lacks state " + t.name + " that this job needs");
      want.ranks[size_t(rank)].boxes.push_back(b);
      continue;
    }
    int64_t v =
        t.name == parallel::kSeedState ? int64_t(m.seed) : m.step;  // the data cursor is the step
    core::Tensor& x = locals.at(size_t(b.local));
    x.data<int64_t>()[0] = v;
  }
  std::vector<int64_t> load;
  std::vector<parallel::Transfer> plan;
  try {
    plan = parallel::cover_rank(space, stored, want, rank, load);
  } catch (const InternalError& e) {
    bad(field, std::string("the checkpoint does not hold all the state: ") + e.what());
  }

  std::vector<std::unique_ptr<ShardReader>> readers(m.shards.size());
  std::vector<uint8_t> buf;
  for (const parallel::Transfer& t : plan) {
    const ShardRecord& sh = m.shards[size_t(t.src)];
    const StateBox& sb = stored.ranks[size_t(t.src)].boxes[size_t(t.src_box)];
    const BoxRecord& rec = sh.boxes[size_t(sb.local)];
    const StateBox& db = want.ranks[size_t(rank)].boxes[size_t(t.dst_box)];
    if (!readers[size_t(t.src)])
      readers[size_t(t.src)] = std::make_unique<ShardReader>(
          (fs::path(step_dir) / sh.file).string(), sh, m.block_bytes, field);
    const size_t n = rec.extent.size();
    const size_t elem = core::dtype_size(m.states[size_t(rec.state)].dtype);
    // The rows [r0, r1) of the stored box that meet the transfer: one contiguous range.
    int64_t row = int64_t(elem);
    for (size_t d = 1; d < n; ++d) row *= rec.extent[d];
    int64_t r0 = n ? t.start[0] - rec.start[0] : 0, r1 = n ? r0 + t.extent[0] : 1;
    buf.resize(size_t((r1 - r0) * row));
    readers[size_t(t.src)]->read(rec.offset + r0 * row, rec.offset + r1 * row, buf.data());
    std::vector<int64_t> src_shape = rec.extent, src_start(n, 0), dst_start(n);
    if (n) src_shape[0] = r1 - r0;
    for (size_t d = 1; d < n; ++d) src_start[d] = t.start[d] - rec.start[d];
    for (size_t d = 0; d < n; ++d) dst_start[d] = t.start[d] - db.start[d] + db.local_start[d];
    core::Tensor& x = locals.at(size_t(db.local));
    WEFT_CHECK(x.is_contiguous() && x.dtype() == m.states[size_t(rec.state)].dtype,
               "load_checkpoint: local tensor ", db.local, " is not a dense ",
               core::dtype_name(m.states[size_t(rec.state)].dtype), " tensor");
    parallel::copy_box(x.raw_data(), x.shape(), dst_start, buf.data(), src_shape, src_start,
                       t.extent, elem);
  }
  int64_t read = 0;
  for (const auto& r : readers)
    if (r) read += r->bytes_read();
  return read;
}

int64_t verify_checkpoint(const std::string& step_dir, const Metadata& m,
                          const std::string& field) {
  int64_t total = 0;
  for (const ShardRecord& sh : m.shards) {
    ShardReader r((fs::path(step_dir) / sh.file).string(), sh, m.block_bytes, field);
    std::vector<uint8_t> all(size_t(sh.bytes));
    r.read(0, sh.bytes, all.data());
    uint32_t c = crc32c(all.data(), all.size());
    if (c != sh.crc32c)
      bad(field, "checkpoint shard " + sh.file + " is corrupted: crc32c " + hex32(c) +
                     ", the metadata says " + hex32(sh.crc32c));
    total += sh.bytes;
  }
  return total;
}

}  // namespace weft::checkpoint
