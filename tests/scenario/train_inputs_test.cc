// Bad and surprising inputs through the `weft` binary, as a user meets them (issue 12): a
// model too large for the machine, running out of memory anyway, FIFOs as data, duplicate
// YAML keys, unbounded values, stray arguments, short smoke runs, benchmark help, broken
// or non-finite weights files, and the README's build paths.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/config/job_spec.h"
#include "tests/support/run_weft.h"

namespace {

namespace fs = std::filesystem;
using Result = weft::test::CommandResult;

const std::string kWeft = WEFT_BINARY;
const std::string kConfigs = std::string(WEFT_SOURCE_DIR) + "/configs/";
const std::string kTiny = kConfigs + "gpt-tiny.yaml";

Result run(const std::string& args) { return weft::test::run_weft(args); }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class TrainInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("weft_inputs_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // `weft train` on gpt-tiny writing into this test's folder, with extra arguments.
  Result train(const std::string& extra) {
    return run("train --config " + kTiny + " --set train.out_dir=" + path("run") +
               " --set train.eval_every=0 " + extra);
  }
  fs::path dir_;
};

// elastic.on_change defaults to reshard (online resize): weft train --help says so, and a
// job file without an elastic: section runs with it (the run folder's config.yaml).
TEST_F(TrainInputs, OnChangeDefaultsToReshardInHelpAndRunFolder) {
  Result help = run("train --help");
  EXPECT_EQ(help.code, 0) << help.out;
  EXPECT_NE(help.out.find("reshard (default)"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("restart stops every worker"), std::string::npos) << help.out;
  Result r = train("--set train.steps=1 --set train.warmup_steps=0");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(path("run") + "/config.yaml");
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(config.find("on_change: reshard"), std::string::npos) << config;
}

// elastic.* keys act only under weft run: as one process or under mpirun the world is fixed,
// so a key set to other than its default is refused naming it, before anything trains. At
// its default (the shipped configs spell on_change: reshard out) it runs, and
// elastic.layout, which fits the layout of any world, is never refused.
TEST_F(TrainInputs, ElasticKeysThatCannotActInAFixedWorldAreRefused) {
  const std::string ran = path("run") + "/metrics.jsonl";
  for (const std::string key : {"elastic.on_change=restart", "elastic.transfer_connections=8",
                                "elastic.old_state=keep_unless_backed", "elastic.min_nodes=2",
                                "elastic.max_nodes=2"}) {
    Result r = train("--set " + key);
    EXPECT_EQ(r.code, 2) << key << ": " << r.out;
    const std::string name = key.substr(0, key.find('='));
    EXPECT_NE(r.out.find(name + ": acts only under weft run"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("this job runs as one process without a launcher"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("launch it with `weft run`"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(ran)) << key;
  }
  if (std::system("command -v mpirun > /dev/null 2>&1") == 0) {
    const std::string root = ::geteuid() == 0 ? " --allow-run-as-root" : "";
    Result mpi = weft::test::run_command("mpirun" + root + " --oversubscribe -np 1 " + kWeft +
                                         " train --config " + kTiny + " --set train.out_dir=" +
                                         path("run") + " --set elastic.transfer_connections=2");
    EXPECT_NE(mpi.code, 0) << mpi.out;
    EXPECT_NE(mpi.out.find("elastic.transfer_connections: acts only under weft run, which "
                           "supervises the workers and lets the world change; this job was "
                           "started by mpirun"),
              std::string::npos)
        << mpi.out;
    EXPECT_FALSE(fs::exists(ran));
  }
  // Defaults spelled out, and elastic.layout: one process trains.
  Result plain = train("--set train.steps=1 --set train.warmup_steps=0 --set elastic.on_change=reshard "
                       "--set elastic.transfer_connections=4 --set elastic.layout=auto");
  EXPECT_EQ(plain.code, 0) << plain.out;
  EXPECT_TRUE(fs::exists(ran));
  // Under weft run the same key acts (restart is its supervised path) and trains.
  Result supervised = run("run --standalone -- " + kWeft + " train --config " + kTiny +
                          " --set train.out_dir=" + path("run2") +
                          " --set train.steps=1 --set train.warmup_steps=0 --set train.eval_every=0"
                          " --set elastic.on_change=restart");
  EXPECT_EQ(supervised.code, 0) << supervised.out;
  EXPECT_TRUE(fs::exists(path("run2") + "/metrics.jsonl"));
}

// Snapshot copies on other nodes need other nodes (a `weft train` alone is one), and a key
// that would do nothing is refused, never silently ignored.
TEST_F(TrainInputs, SnapshotCopiesOnOtherNodesNeedThoseNodes) {
  Result ec = train("--set snapshot.every=5 --set snapshot.redundancy=ec");
  EXPECT_EQ(ec.code, 2) << ec.out;
  EXPECT_NE(ec.out.find("snapshot.ec: k=2, m=1 needs at least k + m = 3 nodes"), std::string::npos)
      << ec.out;
  Result k_alone = train("--set snapshot.every=5 --set snapshot.ec.k=3");
  EXPECT_EQ(k_alone.code, 2) << k_alone.out;
  EXPECT_NE(k_alone.out.find("snapshot.ec.k: snapshot.ec applies to snapshot.redundancy: ec only"),
            std::string::npos)
      << k_alone.out;
  // weft run refuses it before any worker starts, on fewer nodes than k + m.
  Result run_ec = run("run --standalone -- " + kWeft + " train --config " + kTiny +
                      " --set train.out_dir=" + path("run") +
                      " --set snapshot.every=5 --set snapshot.redundancy=ec");
  EXPECT_EQ(run_ec.code, 2) << run_ec.out;
  EXPECT_NE(run_ec.out.find("snapshot.ec: k=2, m=1 needs at least k + m = 3 nodes"),
            std::string::npos)
      << run_ec.out;
  Result replica = train("--set snapshot.every=5 --set snapshot.redundancy=replica");
  EXPECT_EQ(replica.code, 2) << replica.out;
  EXPECT_NE(replica.out.find("snapshot.redundancy: replica needs at least 2 nodes"),
            std::string::npos)
      << replica.out;
  Result nothing = train("--set snapshot.redundancy=replica");
  EXPECT_EQ(nothing.code, 2) << nothing.out;
  EXPECT_NE(nothing.out.find("snapshot.redundancy: 'replica' protects in-memory snapshots"),
            std::string::npos)
      << nothing.out;
  // In-memory snapshots live in the node's snapshot agent, which weft run starts.
  Result alone = train("--set snapshot.every=5");
  EXPECT_EQ(alone.code, 2) << alone.out;
  EXPECT_NE(alone.out.find("snapshot.every: in-memory snapshots are kept by the node's snapshot "
                           "agent, which weft run starts"),
            std::string::npos)
      << alone.out;
  // elastic.min_nodes/max_nodes must agree with weft run's --nnodes (WEFT_NNODES).
  Result r = run("run --standalone -- " + kWeft + " train --config " + kTiny +
                 " --set train.out_dir=" + path("run") + " --set elastic.max_nodes=4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("elastic.max_nodes: the job file asks for 4 but weft run was started with --nnodes 1:1"),
            std::string::npos)
      << r.out;
}

TEST_F(TrainInputs, ModelTooLargeIsRefusedWithItsSizesBeforeAllocating) {
  // Used to be killed by the kernel after taking 24 GB (exit 137, no message).
  Result r = train("--set model.layers=100000");
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model: the job needs "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GiB per rank (parameters "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GiB available for 1 rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory.limit_gib"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("run") + "/metrics.jsonl"));
  // Used to end in std::bad_alloc naming nothing.
  r = train("--set model.dim=1000000");
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model: the job needs "), std::string::npos) << r.out;

  // memory.limit_gib replaces what the machine says: too little refuses a job that fits...
  r = train("--set train.steps=1 --set memory.limit_gib=0.001");
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("but memory.limit_gib allows 0.001 GiB per rank"), std::string::npos)
      << r.out;
  // ...and enough lets it run.
  r = train("--set train.steps=1 --set memory.limit_gib=2");
  EXPECT_EQ(r.code, 0) << r.out;
  r = train("--set memory.limit_gib=-1");
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("memory.limit_gib: expected GiB per rank > 0"), std::string::npos) << r.out;
}

TEST_F(TrainInputs, ModelTooLargeIsRefusedOnEveryRank) {
  Result r = run("run --standalone --nproc-per-node 2 -- " + kWeft + " train --config " + kConfigs +
                 "gpt-layout.yaml --set parallel.dp=2 --set model.layers=100000 " +
                 "--set train.out_dir=" + path("run"));
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("GiB available for 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model: the job needs "), std::string::npos) << r.out;
}

TEST_F(TrainInputs, OutOfMemoryIsAClearRunTimeError) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the binary reserves terabytes of shadow memory, so "
                  "it cannot start inside the ulimit -v this test sets";
#endif
  // The estimate passes (limit_gib set far above), then the address-space limit makes the
  // first large allocation fail.
  Result r = weft::test::run_command(
      "bash -c 'ulimit -v 4000000; exec " + kWeft + " train --config " + kTiny +
      " --set model.dim=16384 --set memory.limit_gib=100000 --set train.steps=1 --set "
      "train.out_dir=" +
      path("run") + "'");
  ASSERT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("weft train: failed: out of memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("shrink model.layers/model.dim"), std::string::npos) << r.out;
}

TEST_F(TrainInputs, FifoAsDataIsRefusedInsteadOfBlocking) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0600), 0);
  // `timeout` only bounds a regression (a reader blocked on the FIFO); the check is the code.
  for (const char* field : {"data.path", "data.val_path"}) {
    Result r = weft::test::run_command("timeout 60 " + kWeft + " train --config " + kTiny +
                                       " --set train.steps=1 --set " + field + "=" + path("pipe") +
                                       " --set train.out_dir=" + path("run"));
    ASSERT_EQ(r.code, 2) << field << ": " << r.out;
    EXPECT_NE(r.out.find(std::string(field) + ": '" + path("pipe") + "': is a FIFO"),
              std::string::npos)
        << r.out;
  }
  Result r = train("--set train.steps=1 --set data.path=/dev/zero");
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is a character device, not a regular file or folder"), std::string::npos)
      << r.out;
}

TEST_F(TrainInputs, DuplicateYamlKeysAreRefusedWithBothLines) {
  std::ofstream(path("dup.yaml")) << "model: {layers: 2, dim: 64, heads: 4}\n"
                                     "data: {path: "
                                  << WEFT_SOURCE_DIR << "/configs/../README.md}\n"
                                  << "model: {layers: 8}\n";
  Result r = run("train --config " + path("dup.yaml"));
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model: 'model' is written twice"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lines 1 and 3 of " + path("dup.yaml")), std::string::npos) << r.out;
  // --set over a key of the file is an override, not a duplicate.
  r = train("--set train.steps=1 --set train.steps=2 --set model.layers=1");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST_F(TrainInputs, UnboundedValuesAreRefusedNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"train.threads=100000", "train.threads: expected an integer in [0, 1024]"},
      {"train.eval_batches=1099511627776", "train.eval_batches: expected an integer in"},
      {"parallel.pipeline.micro_batches=1073741824", "parallel.pipeline.micro_batches: expected"},
      {"train.global_batch=1073741824", "train.global_batch: expected an integer in"},
  };
  for (const auto& [set, message] : cases) {
    Result r = train(std::string("--set ") + set);
    ASSERT_EQ(r.code, 2) << set << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
  }
}

TEST_F(TrainInputs, ExtraPositionalArgumentsAreRefused) {
  const std::string commands[] = {
      "train --config " + kTiny + " extra",
      "plan --config " + kTiny + " --world 1 extra",
      "ckpt export " + path("none") + " " + path("out.safetensors") + " extra",
      "store --port 0 extra",
      "run --standalone --nproc-per-node 1 extra -- true",
      "bench train extra",
      "bench memory extra",
      "bench checkpoint extra",
      "bench scaling extra",
      "bench comm extra",
  };
  for (const std::string& c : commands) {
    Result r = run(c);
    EXPECT_EQ(r.code, 2) << c << ": " << r.out;
    EXPECT_NE(r.out.find("error: extra: unexpected argument"), std::string::npos) << c << ": "
                                                                                  << r.out;
  }
  // A config given without --config is pointed at the flag.
  Result r = run("train " + kTiny);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("did you mean --config " + kTiny + "?"), std::string::npos) << r.out;
}

TEST_F(TrainInputs, ShortSmokeRunClipsTheWarmupWithOneNote) {
  // gpt-tiny warms up over 10 steps; the first smoke test everyone runs is 5.
  Result r = train("--set train.steps=5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "note: train.warmup_steps 10 > train.steps 5: warming up over all 5 steps"),
            1u)
      << r.out;
  EXPECT_NE(r.out.find("step     4/5"), std::string::npos) << r.out;
  // The run folder's config records the warm-up the run used.
  weft::core::JobSpec used = weft::core::load_job_spec(path("run") + "/config.yaml");
  EXPECT_EQ(used.train.warmup_steps, 5);

  // Several ranks: rank 0 alone says it.
  r = run("run --standalone --nproc-per-node 2 -- " + kWeft + " train --config " + kConfigs +
          "gpt-layout.yaml --set parallel.dp=2 --set train.steps=3 --set train.out_dir=" +
          path("ranks"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "note: train.warmup_steps"), 1u) << r.out;

  // Every shipped config validates and plans with --set train.steps=5 on its own layout.
  int n = 0;
  for (const auto& e : fs::directory_iterator(kConfigs)) {
    if (e.path().extension() != ".yaml") continue;
    weft::core::JobSpec s = weft::core::load_job_spec(e.path().string(), {"train.steps=5"});
    const auto& p = s.parallel;
    const int64_t world = std::max<int64_t>(p.dp, 1) * std::max<int64_t>(p.tp, 1) *
                          std::max<int64_t>(p.pp, 1) * std::max<int64_t>(p.ep, 1);
    // A searched config has no layout of its own: it is written for the 1024 GPUs its
    // comment names (gpt3-175b-like, llama3-70b-like), where lowering a plan takes minutes;
    // the search alone (--compare-megatron) validates it and finds a layout that fits.
    const std::string where = p.plan == "search" ? "1024 --compare-megatron" : std::to_string(world);
    Result plan = run("plan --config " + e.path().string() + " --world " + where + " --set train.steps=5");
    EXPECT_EQ(plan.code, 0) << e.path() << ": " << plan.out;
    ++n;
  }
  EXPECT_GE(n, 7);
}

TEST_F(TrainInputs, EveryBenchmarkHasHelpAndAWrongNameListsThemAll) {
  const char* names[] = {"train", "memory", "comm", "checkpoint", "scaling"};
  for (const char* name : names) {
    Result r = run(std::string("bench ") + name + " --help");
    EXPECT_EQ(r.code, 0) << name << ": " << r.out;
    EXPECT_NE(r.out.find(std::string("usage: weft bench ") + name), std::string::npos) << r.out;
  }
  Result r = run("bench nope");
  ASSERT_EQ(r.code, 2) << r.out;
  for (const char* name : names) EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unknown benchmark 'nope'"), std::string::npos) << r.out;
}

// Every ./build/... program the README shows is either built by ./setup.sh or comes with
// the command that builds it on the same line.
TEST(Readme, EveryBuildPathItShowsIsBuiltOrSaysHow) {
  std::ifstream setup_file(std::string(WEFT_SOURCE_DIR) + "/setup.sh");
  std::stringstream setup;
  setup << setup_file.rdbuf();
  std::set<std::string> built;
  std::smatch m;
  std::string text = setup.str();
  for (std::regex target(R"(--target\s+(\w+))");
       std::regex_search(text, m, target); text = m.suffix())
    built.insert(m[1]);
  ASSERT_TRUE(built.count("weft")) << setup.str();

  std::ifstream readme(std::string(WEFT_SOURCE_DIR) + "/README.md");
  int paths = 0;
  const std::regex program(R"(\./build/[\w/]*/(\w+))");
  for (std::string line; std::getline(readme, line);) {
    for (std::string rest = line; std::regex_search(rest, m, program); rest = m.suffix()) {
      ++paths;
      const std::string name = m[1];
      EXPECT_TRUE(built.count(name) || line.find("--target " + name) != std::string::npos)
          << "README shows " << m[0] << " but ./setup.sh does not build it and the line does "
          << "not say how: " << line;
    }
  }
  EXPECT_GE(paths, 2);
}

TEST_F(TrainInputs, SaveWeightsRefusesDivergedWeights) {
  // An absurd learning rate drives the weights to infinity and NaN within a few steps.
  Result r = train("--set train.steps=4 --set train.lr=1e38 --set train.warmup_steps=0 " +
                   std::string("--save-weights ") + path("w.safetensors"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_FALSE(fs::exists(path("w.safetensors"))) << r.out;
  EXPECT_FALSE(fs::exists(path("w.safetensors.tmp"))) << r.out;
}

TEST_F(TrainInputs, InitWeightsWithAHeaderLengthOffByThePaddingAreRefused) {
  Result r = train("--set train.steps=1 --save-weights " + path("w.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  // Declare the header without its padding spaces: every tensor would read shifted.
  std::fstream f(path("w.safetensors"), std::ios::binary | std::ios::in | std::ios::out);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const uint64_t unpadded = header.find_last_of('}') + 1;
  ASSERT_LT(unpadded, n) << "this header has no padding to drop";
  f.seekp(0);
  f.write(reinterpret_cast<const char*>(&unpadded), 8);
  f.close();
  r = train("--set train.steps=1 --init-weights " + path("w.safetensors"));
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--init-weights: '" + path("w.safetensors") + "'"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the header length is wrong"), std::string::npos) << r.out;
}

}  // namespace
