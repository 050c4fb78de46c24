// Bad checkpoints are refused with a clear error and nothing loaded: a flipped byte, a
// truncated shard, another model, a missing folder. Atomic commit: a save killed part-way
// (kill -9) leaves the previous checkpoint loadable. Async saves write the same bytes as
// sync ones, taken at the moment save() returned.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>

#include "tests/checkpoint/ckpt_util.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;
using test_util::TempDir;
using test_util::tiny_job;

std::string saved(core::JobSpec& spec, const TempDir& dir, core::Trainer& t) {
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.async = false;
  return TrainerCheckpoints(spec, t).save();
}

ConfigError resume_error(const core::JobSpec& spec, const std::string& path) {
  core::Trainer t(spec);
  auto before = test_util::whole_state(t);
  try {
    TrainerCheckpoints c(spec, t, path);
  } catch (const ConfigError& e) {
    // Nothing loaded: the trainer's state is as it was.
    auto after = test_util::whole_state(t);
    for (auto& [n, x] : before)
      EXPECT_TRUE(test_util::same_bytes(x, after.at(n))) << n << " changed";
    EXPECT_EQ(t.current_step(), 0);
    return e;
  }
  ADD_FAILURE() << "expected a ConfigError";
  return ConfigError("", "");
}

TEST(CheckpointIntegrity, AFlippedByteIsNamed) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  core::Trainer t(spec);
  std::string step = saved(spec, dir, t);
  std::string shard = (fs::path(step) / "shard-00000.bin").string();
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(1000);
    f.write(&c, 1);
  }
  ConfigError e = resume_error(spec, dir.str());
  EXPECT_EQ(e.field(), "--resume");
  EXPECT_NE(std::string(e.what()).find("corrupted"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("shard-00000.bin"), std::string::npos) << e.what();
  Metadata m = read_metadata(step, "x");
  EXPECT_THROW(verify_checkpoint(step, m, "x"), ConfigError);
}

TEST(CheckpointIntegrity, ATruncatedShardIsNamed) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  core::Trainer t(spec);
  std::string step = saved(spec, dir, t);
  fs::resize_file(fs::path(step) / "shard-00000.bin", 4096);
  ConfigError e = resume_error(spec, step);
  EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
}

TEST(CheckpointIntegrity, AnotherModelIsRefusedNamingBoth) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  core::Trainer t(spec);
  saved(spec, dir, t);
  core::JobSpec bigger = spec;
  bigger.model.layers = 3;
  ConfigError e = resume_error(bigger, dir.str());
  EXPECT_EQ(e.field(), "--resume");
  EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("2 layers"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("3 layers"), std::string::npos) << e.what();
}

TEST(CheckpointIntegrity, AMissingFolderIsNamed) {
  core::JobSpec spec = tiny_job();
  ConfigError e = resume_error(spec, "/nonexistent/weft-ckpt");
  EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  TempDir empty;
  ConfigError f = resume_error(spec, empty.str());
  EXPECT_NE(std::string(f.what()).find("no committed checkpoint"), std::string::npos) << f.what();
}

TEST(CheckpointAtomicity, AnUncommittedTemporaryFolderIsIgnoredAndCleanedUp) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  core::Trainer t(spec);
  std::string step0 = saved(spec, dir, t);
  // What a crash between writing and renaming leaves: a temporary folder of a later step,
  // whose owner file names a process that is gone.
  fs::path tmp = dir.path / ".tmp-step-00000020-00000000000000aa";
  fs::copy(step0, tmp);
  fs::resize_file(tmp / "shard-00000.bin", 100);
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::ofstream(tmp / "owner") << host << " " << gone << "\n";
  EXPECT_EQ(resolve_checkpoint(dir.str(), "--resume"), step0);
  core::Trainer u(spec);
  TrainerCheckpoints ok(spec, u, dir.str());
  EXPECT_EQ(u.current_step(), 0);
  // A later committed save at or past that step removes the leftover.
  t.set_current_step(20);
  saved(spec, dir, t);
  EXPECT_FALSE(fs::exists(tmp));
}

TEST(CheckpointAtomicity, KillNineDuringSavesLeavesALoadableCheckpoint) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.model.dim = 128;  // a few MiB per save, so the kill lands inside one
  core::Trainer t(spec);
  std::string first = saved(spec, dir, t);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (int64_t s = 1;; ++s) {  // save until killed
      t.set_current_step(s);
      spec.checkpoint.keep = 1000;
      TrainerCheckpoints(spec, t).save();
    }
  }
  // Wait until the child has committed at least one save of its own, then kill it.
  int status = 0;
  while (list_checkpoints(dir.str()).size() < 3) {
    ASSERT_EQ(::waitpid(child, &status, WNOHANG), 0) << "the saving child ended by itself";
    ::usleep(1000);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  std::string latest = resolve_checkpoint(dir.str(), "--resume");
  Metadata m = read_metadata(latest, "--resume");
  EXPECT_GT(verify_checkpoint(latest, m, "--resume"), 0);
  core::Trainer u(spec);
  TrainerCheckpoints loaded(spec, u, dir.str());
  EXPECT_EQ(u.current_step(), m.step);
  auto a = test_util::whole_state(t), b = test_util::whole_state(u);
  for (auto& [n, x] : a) EXPECT_TRUE(test_util::same_bytes(x, b.at(n))) << n;
}

TEST(CheckpointAsync, WritesTheSameBytesAsSyncTakenWhenSaveReturned) {
  TempDir sync_dir, async_dir;
  core::JobSpec spec = tiny_job();
  core::Trainer t(spec);
  parallel::StateSpace space = parallel::StateSpace::from_graph(t.model().graph);
  parallel::Layout layout = parallel::whole_layout(space);
  CheckpointInfo info{&spec, 3, "single process", "00000000000000aa"};  // same job: same bytes
  HeldState held{{0}, {trainer_tensors(t, space)}};
  std::string a = save_checkpoint(sync_dir.str(), info, space, layout, held, 3);
  AsyncSaver saver;
  saver.save(async_dir.str(), info, space, layout, held, 3);
  // Training goes on: the live tensors change while the background write runs.
  for (const parallel::StateTensor& st : space.tensors())
    if (st.kind != parallel::StateKind::kScalar) t.executor().tensor(st.value).fill_(7.0);
  saver.wait();
  std::string b = saver.last_folder();
  ASSERT_FALSE(b.empty());
  for (const auto& e : fs::directory_iterator(a)) {
    std::string name = e.path().filename().string();
    EXPECT_EQ(test_util::read_file(e.path().string()),
              test_util::read_file((fs::path(b) / name).string()))
        << name;
  }
}

}  // namespace
}  // namespace weft::checkpoint
