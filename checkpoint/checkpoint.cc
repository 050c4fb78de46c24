// Saving: shard files with per-block checksums (and the non-finite scan), metadata, the
// atomic commit (temporary folder, fsync, rename, fsync of the parent), retention, and the
// background saver.
#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/job_id.h"
#include "checkpoint/retention.h"
#include "parallel/launch_env.h"
#include "parallel/router.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw IoError("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) io_fail("cannot open", path);
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_fail("cannot fsync", path);
  }
  ::close(fd);
}

// A file written sequentially; tracks the whole-file and per-block checksums.
class ShardWriter {
 public:
  ShardWriter(std::string path, int64_t block) : path_(std::move(path)), block_(block) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) io_fail("cannot create", path_);
  }
  ~ShardWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const uint8_t* p, int64_t n) {
    for (int64_t done = 0; done < n;) {
      int64_t room = block_ - in_block_, take = std::min(room, n - done);
      block_crc_ = crc32c(p + done, size_t(take), block_crc_);
      whole_ = crc32c(p + done, size_t(take), whole_);
      in_block_ += take, done += take;
      if (in_block_ == block_) blocks_.push_back(block_crc_), block_crc_ = 0, in_block_ = 0;
    }
    for (int64_t done = 0; done < n;) {
      ssize_t w = ::write(fd_, p + done, size_t(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) io_fail("cannot write", path_);
      done += w;
    }
    bytes_ += n;
  }
  void finish(ShardRecord& rec) {
    if (in_block_ > 0) blocks_.push_back(block_crc_);
    if (::fsync(fd_) != 0) io_fail("cannot fsync", path_);
    if (::close(fd_) != 0) io_fail("cannot close", path_);
    fd_ = -1;
    rec.bytes = bytes_, rec.crc32c = whole_, rec.block_crc32c = blocks_;
  }

 private:
  std::string path_;
  int64_t block_;
  int fd_ = -1;
  int64_t bytes_ = 0, in_block_ = 0;
  uint32_t whole_ = 0, block_crc_ = 0;
  std::vector<uint32_t> blocks_;
};

void write_text(const std::string& path, const std::string& text) {
  ShardWriter w(path, kBlockBytes);
  w.write(reinterpret_cast<const uint8_t*>(text.data()), int64_t(text.size()));
  ShardRecord ignored;
  w.finish(ignored);
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<long long, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    long long s;
    char tail;
    if (std::sscanf(n.c_str(), "step-%lld%c", &s, &tail) == 1 &&
        fs::exists(e.path() / kMetadataFile))
      found.push_back({s, e.path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(p);
  return out;
}

namespace {

// The metadata of a save without its shards; record_of[state id] = its index in `states`
// (-1 for the scalars, which live in the metadata's fields).
Metadata base_metadata(const CheckpointInfo& info, const parallel::StateSpace& space,
                       std::vector<int>& record_of) {
  if (!info.spec) throw InternalError("save_checkpoint: no job spec");
  const core::JobSpec& spec = *info.spec;
  Metadata m;
  m.model_hash = core::model_config_hash(spec.model);
  m.model =
      spec.model.arch + ", " + std::to_string(spec.model.layers) + " layers, dim " +
      std::to_string(spec.model.dim) + ", heads " + std::to_string(spec.model.heads) + ", vocab " +
      std::to_string(spec.model.vocab) + ", seq_len " + std::to_string(spec.model.seq_len) +
      (spec.model.arch == "moe-gpt" ? ", experts " + std::to_string(spec.model.moe.experts) : "") +
      (spec.model.is_llama() ? ", kv_heads " + std::to_string(spec.model.kv()) + ", ffn_dim " +
                                   std::to_string(spec.model.mlp_width()) +
                                   (spec.model.tie_embeddings ? ", tied head" : "")
                             : "");
  m.job_yaml = core::job_spec_to_yaml(spec);
  m.step = info.step;
  m.seed = spec.train.seed;
  m.global_batch = spec.train.global_batch;
  m.data_sequence = info.step * spec.train.global_batch;
  m.layout = info.layout;
  m.job_id = info.job_id.empty() ? new_job_id() : info.job_id;
  record_of.assign(size_t(space.size()), -1);
  for (const parallel::StateTensor& t : space.tensors()) {
    if (t.kind == parallel::StateKind::kScalar) continue;
    record_of[size_t(t.id)] = int(m.states.size());
    m.states.push_back(StateRecord{t.name, parallel::state_kind_name(t.kind), t.dtype, t.shape});
  }
  return m;
}

// Which holder of a replicated box writes it: spread over the replicas by state, so that
// data-parallel copies share the writing instead of rank 0 writing everything.
bool writes(const parallel::StateBox& b) { return b.replica == b.state % std::max(1, b.replicas); }

// Writes rank `rank`'s shard into `dir`; the record has no boxes when it writes none (and
// the file is removed). Each box is scanned for non-finite values right after it is gathered.
ShardRecord write_shard(const std::string& dir, const parallel::Layout& layout, int rank,
                        const std::vector<core::Tensor>& locals, const std::vector<int>& record_of,
                        const Metadata& m) {
  const parallel::RankLayout& rl = layout.ranks.at(size_t(rank));
  ShardRecord rec;
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05d.bin", rank);
  rec.file = name;
  rec.rank = rank;
  ShardWriter w((fs::path(dir) / name).string(), kBlockBytes);
  std::vector<uint8_t> buf;
  int64_t offset = 0;
  for (const parallel::StateBox& b : rl.boxes) {
    if (!writes(b) || record_of[size_t(b.state)] < 0) continue;
    const core::Tensor& x = locals.at(size_t(b.local));
    const size_t elem = core::dtype_size(x.dtype());
    core::Tensor c = x.contiguous();
    buf.resize(size_t(b.numel()) * elem);
    parallel::copy_box(buf.data(), b.extent, std::vector<int64_t>(b.extent.size(), 0), c.raw_data(),
                       c.shape(), b.local_start, b.extent, elem);
    if (int64_t bad = count_non_finite(buf.data(), b.numel(), x.dtype()))
      throw NonFiniteStateError(
          "checkpoint: refusing to save step " + std::to_string(m.step) + ": state " +
          m.states[size_t(record_of[size_t(b.state)])].name + " holds " + std::to_string(bad) +
          " non-finite value(s) (NaN or infinity); nothing was committed, the previous "
          "checkpoints stay");
    rec.boxes.push_back(
        BoxRecord{record_of[size_t(b.state)], b.start, b.extent, offset, int64_t(buf.size())});
    offset += int64_t(buf.size());
    w.write(buf.data(), int64_t(buf.size()));
  }
  w.finish(rec);
  std::error_code ec;
  if (rec.boxes.empty()) fs::remove(fs::path(dir) / name, ec);
  return rec;
}

// A new, empty temporary folder of this job with its owner file.
void fresh_dir(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (!fs::create_directory(dir, ec))
    throw IoError("checkpoint: cannot create " + dir + ": " + ec.message());
  write_owner(dir);
}

void remove_quietly(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// Checks that the shards hold every element of every state once, writes the metadata and
// commits `tmp` as the step folder (see the header for the order of fsyncs and renames).
std::string commit(const std::string& root, const std::string& tmp, const Metadata& m,
                   int64_t keep) {
  std::vector<int64_t> written(m.states.size(), 0);
  for (const ShardRecord& sh : m.shards)
    for (const BoxRecord& b : sh.boxes) {
      int64_t n = 1;
      for (int64_t e : b.extent) n *= e;
      written[size_t(b.state)] += n;
    }
  for (size_t i = 0; i < m.states.size(); ++i)
    if (written[i] != core::shape_numel(m.states[i].shape))
      throw InternalError("save_checkpoint: the shards hold " + std::to_string(written[i]) +
                          " of " + std::to_string(core::shape_numel(m.states[i].shape)) +
                          " elements of " + m.states[i].name);
  write_text((fs::path(tmp) / kMetadataFile).string(), metadata_to_json(m));
  remove_owner(tmp);
  fsync_path(tmp, true);
  // A rename cannot replace a non-empty folder: an existing folder of the same step (a run
  // resumed before it, or another job saving the same step) moves aside first, and goes
  // once the new one is in place. Another job may commit in between: then try again, so
  // that the folder always ends up whole, one job's or the other's, never a mix.
  const std::string final_dir = (fs::path(root) / step_name(m.step)).string();
  const std::string aside = tmp + ".old";
  bool moved_aside = false;
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    if (fs::exists(final_dir)) {
      fs::remove_all(aside, ec);
      fs::rename(final_dir, aside, ec);
      if (!ec) moved_aside = true;
    }
    if (::rename(tmp.c_str(), final_dir.c_str()) == 0) break;
    if ((errno != ENOTEMPTY && errno != EEXIST) || attempt == 8)
      io_fail("cannot rename " + tmp + " to", final_dir);
  }
  fsync_path(root, true);
  if (moved_aside) remove_quietly(aside);
  prune(root, keep, m.step, m.job_id);
  return final_dir;
}

}  // namespace

std::string save_checkpoint(const std::string& root, const CheckpointInfo& info,
                            const parallel::StateSpace& space, const parallel::Layout& layout,
                            const HeldState& held, int64_t keep) {
  std::vector<int> record_of;
  Metadata m = base_metadata(info, space, record_of);
  fs::create_directories(root);
  const std::string tmp = tmp_folder(root, info.step, m.job_id);
  try {
    fresh_dir(tmp);
    for (size_t h = 0; h < held.ranks.size(); ++h) {
      ShardRecord rec = write_shard(tmp, layout, held.ranks[h], held.tensors.at(h), record_of, m);
      if (!rec.boxes.empty()) m.shards.push_back(std::move(rec));
    }
    return commit(root, tmp, m, keep);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
}

namespace {

// One phase of a save by several ranks: runs `fn`, then all ranks agree whether any failed
// (collective, so none waits for a rank that has given up). A failing rank rethrows its own
// error, the others throw an IoError; rank 0 removes the temporary folder first.
template <typename Fn>
void phase(comm::Communicator& comm, int rank, const std::string& tmp, int64_t step, Fn&& fn) {
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();
  }
  if (!parallel::agree_stop(comm, failure != nullptr)) return;
  if (rank == 0) remove_quietly(tmp);
  if (failure) std::rethrow_exception(failure);
  throw IoError("checkpoint: another rank failed to save step " + std::to_string(step) +
                " (its error names the cause); nothing was committed");
}

}  // namespace

std::string save_checkpoint_ranks(const std::string& root, const CheckpointInfo& info,
                                  const parallel::StateSpace& space, const parallel::Layout& layout,
                                  int rank, const std::vector<core::Tensor>& locals, int64_t keep,
                                  comm::Communicator& comm) {
  CheckpointInfo agreed = info;
  if (agreed.job_id.empty()) agreed.job_id = agree_job_id(comm);
  std::vector<int> record_of;
  Metadata m = base_metadata(agreed, space, record_of);
  const std::string tmp = tmp_folder(root, info.step, m.job_id);
  phase(comm, rank, tmp, info.step, [&] {
    if (rank != 0) return;
    fs::create_directories(root);
    fresh_dir(tmp);
  });
  // Each rank's shard record travels to rank 0 as a small metadata file of its own.
  phase(comm, rank, tmp, info.step, [&] {
    Metadata mine = m;
    ShardRecord rec = write_shard(tmp, layout, rank, locals, record_of, m);
    if (!rec.boxes.empty()) mine.shards.push_back(std::move(rec));
    char side[40];
    std::snprintf(side, sizeof side, "shard-%05d.json", rank);
    write_text((fs::path(tmp) / side).string(), metadata_to_json(mine));
  });
  std::string final_dir = (fs::path(root) / step_name(info.step)).string();
  phase(comm, rank, tmp, info.step, [&] {
    if (rank != 0) return;
    char side[40];
    for (int r = 0; r < comm.size(); ++r) {
      std::snprintf(side, sizeof side, "shard-%05d.json", r);
      const fs::path p = fs::path(tmp) / side;
      std::ifstream in(p, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      for (ShardRecord& sh : metadata_from_json(text, p.string()).shards)
        m.shards.push_back(std::move(sh));
      fs::remove(p);
    }
    final_dir = commit(root, tmp, m, keep);
  });
  return final_dir;
}

AsyncSaver::~AsyncSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    WEFT_LOG(kError, "checkpoint", "background save failed: ", e.what());
  }
}

void AsyncSaver::save(const std::string& root, const CheckpointInfo& info,
                      const parallel::StateSpace& space, const parallel::Layout& layout,
                      const HeldState& held, int64_t keep,
                      std::function<void(const std::string&, double)> on_commit) {
  wait();
  const auto t0 = std::chrono::steady_clock::now();  // this save's time, not the previous one's
  // Host copies now, so the caller may overwrite its tensors as soon as we return.
  HeldState copy;
  copy.ranks = held.ranks;
  for (const auto& ts : held.tensors) {
    copy.tensors.emplace_back();
    for (const core::Tensor& t : ts) copy.tensors.back().push_back(t.defined() ? t.clone() : t);
  }
  spec_copy_ = std::make_unique<core::JobSpec>(*info.spec);
  CheckpointInfo mine = info;
  mine.spec = spec_copy_.get();
  worker_ = std::thread([this, root, mine, space, layout, copy = std::move(copy), keep,
                         on_commit = std::move(on_commit), t0] {
    try {
      last_folder_ = save_checkpoint(root, mine, space, layout, copy, keep);
      if (on_commit)
        on_commit(last_folder_,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void AsyncSaver::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace weft::checkpoint
