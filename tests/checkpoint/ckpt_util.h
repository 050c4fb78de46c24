// Shared helpers of the checkpoint tests: a tiny job on the fortunes corpus, a trainer that
// records its losses, temporary folders, and slicing whole tensors into any layout.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/trainer_state.h"
#include "core/config/job_spec.h"
#include "core/data/dataset.h"
#include "core/io/metrics.h"
#include "parallel/router.h"

namespace weft::checkpoint::test_util {

inline core::JobSpec tiny_job(bool moe = false) {
  std::string cfg =
      std::string(WEFT_SOURCE_DIR) + (moe ? "/configs/moe-tiny.yaml" : "/configs/gpt-tiny.yaml");
  core::JobSpec s =
      core::load_job_spec(cfg, {"train.eval_every=0", "train.threads=1", "train.steps=14"});
  return s;
}

// A fresh folder under the system temp dir, removed with the object.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("weft-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// Runs steps until `until` (exclusive), returning each step's loss.
inline std::vector<double> train(core::Trainer& t, const core::data::TokenDataset& data,
                                 int64_t until, TrainerCheckpoints* ckpt = nullptr) {
  std::vector<double> losses;
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  while (t.current_step() < until) {
    losses.push_back(t.step(batch).loss);
    if (ckpt) ckpt->after_step();
  }
  return losses;
}

// Local tensors of rank `rank` of `layout`, cut from whole tensors (`whole[name]`).
inline std::vector<core::Tensor> slice_for(const parallel::StateSpace& space,
                                           const parallel::Layout& layout, int rank,
                                           const std::map<std::string, core::Tensor>& whole) {
  const parallel::RankLayout& rl = layout.ranks[size_t(rank)];
  std::vector<core::Tensor> out = parallel::allocate_locals(rl);
  for (const parallel::StateBox& b : rl.boxes) {
    const parallel::StateTensor& st = space.at(b.state);
    if (st.kind == parallel::StateKind::kScalar) continue;
    const core::Tensor& w = whole.at(st.name);
    core::Tensor& x = out[size_t(b.local)];
    parallel::copy_box(x.raw_data(), x.shape(), b.local_start, w.raw_data(), w.shape(), b.start,
                       b.extent, core::dtype_size(w.dtype()));
  }
  return out;
}

// The trainer's state tensors by name (copies).
inline std::map<std::string, core::Tensor> whole_state(core::Trainer& t) {
  parallel::StateSpace space = parallel::StateSpace::from_graph(t.model().graph);
  std::vector<core::Tensor> ts = trainer_tensors(t, space);
  std::map<std::string, core::Tensor> out;
  for (const parallel::StateTensor& st : space.tensors())
    if (st.kind != parallel::StateKind::kScalar) out[st.name] = ts[size_t(st.id)].clone();
  return out;
}

inline bool same_bytes(const core::Tensor& a, const core::Tensor& b) {
  core::Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// The bytes of the files directly in `dir`.
inline int64_t folder_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) n += int64_t(e.file_size());
  return n;
}

inline std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `weft train` arguments for a 12-step gpt-tiny run in `d` (run folder run-NAME, metrics
// NAME.jsonl) plus `extra`: the run the CLI tests resume, verify and import.
inline std::string train_cmd(const TempDir& d, const std::string& name, const std::string& extra) {
  return "train --config " + std::string(WEFT_SOURCE_DIR) +
         "/configs/gpt-tiny.yaml --set train.steps=12 " +
         "--set train.warmup_steps=1 --set train.eval_every=0 --set train.threads=1 --set "
         "train.log_every=100 --set train.out_dir=" +
         d.str() + "/run-" + name + " --metrics " + d.str() + "/" + name + ".jsonl " + extra;
}

// The training loss of each step in a metrics file.
inline std::map<int64_t, double> losses(const std::string& path) {
  std::map<int64_t, double> out;
  for (const core::io::MetricsRow& r : core::io::read_metrics(path))
    if (r.has("loss")) out[int64_t(r.at("step"))] = r.at("loss");
  return out;
}

}  // namespace weft::checkpoint::test_util
