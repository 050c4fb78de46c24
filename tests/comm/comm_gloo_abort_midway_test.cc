// abort() while a message is half moved between two live ranks. Gloo fails the operations
// queued on a connection when it ends, but not the receive whose bytes its event loop is
// reading. Before the communicator tracked its buffers (gloo_abortable.h), that wait ran on
// to the collective's timeout (and then reported the abort, which had come first). The
// assertion is the outcome of a wait bounded by half the collective's timeout: the abort,
// not TimeoutError.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "base/config.h"
#include "comm/registry.h"
#include "comm/store/store.h"
#include "tests/support/multiprocess.h"

#if WEFT_HAVE_GLOO

namespace weft::comm {
namespace {

using namespace std::chrono_literals;
using core::DType;
using core::Tensor;

// 64 MiB: far more than loopback's socket buffers hold, so a transfer frozen after its first
// bytes still has most of them to move.
constexpr int64_t kElements = int64_t(16) << 20;
constexpr int kAttempts = 8;
constexpr Millis kTimeout = 60s;  // the collective's
// How long an aborted wait may take: half the collective's timeout, so that a wait the abort
// did not end fails here as TimeoutError, before Gloo's own timeout would end it (its error
// would then be reported as the abort, which came first, and hide the stall).
constexpr Millis kAbortedWaitBound = 30s;

uint32_t word_at(const Tensor& t, int64_t i) {
  return __atomic_load_n(static_cast<const uint32_t*>(t.raw_data()) + i, __ATOMIC_ACQUIRE);
}

// 'T' once the process is stopped (the signal may still be on its way when kill returns).
bool stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'T';
}

// What an aborted wait must report: the abort, named by its reason.
void expect_aborted(Work& w, const std::string& reason) {
  try {
    w.wait(kAbortedWaitBound);
    ADD_FAILURE() << "the broadcast succeeded although aborted midway";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "the abort did not end the wait: " << e.what();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

// Rank 1 broadcasts 64 MiB to rank 0. Rank 0 freezes rank 1 (SIGSTOP) once the first bytes
// have arrived, and checks that the last have not: its receive is then on the wire (and rank
// 1's send, more than the socket buffers hold, unfinished). A transfer that finished before
// the freeze took hold is let through and tried again. Then, with `kill_sender`, rank 1 dies
// there (SIGKILL, as a lost node's worker); without, it aborts too once rank 0 has. Rank 0
// aborts from another thread, as the LossWatcher does, and its wait must end with that abort.
test::RunResult run_midway(bool kill_sender) {
  return test::run_ranks(
      2,
      [kill_sender](test::RankContext& ctx) {
        auto store = ctx.store();
        CommOptions o;
        o.rank = ctx.rank();
        o.size = ctx.world();
        o.store = store.get();
        o.prefix = "midway";
        o.timeout = kTimeout;
        std::unique_ptr<Communicator> comm = make_communicator(BackendKind::kGloo, o);
        if (ctx.rank() == 1) {
          store->set_string("pid1", std::to_string(::getpid()));
          std::thread aborter([&] {
            auto s = ctx.store();
            s->wait({"abort1"}, 120s);
            comm->abort("rank 1 aborted midway");
          });
          Tensor t = Tensor::empty({kElements}, DType::kF32);
          std::fill_n(t.data<float>(), kElements, 1.0f);
          for (int a = 0; a < kAttempts; ++a) {
            Work w = comm->broadcast(t, {.root = 1});
            if (store->get_string("caught" + std::to_string(a)) == "1") {
              expect_aborted(w, "rank 1 aborted midway");
              break;
            }
            w.wait();  // missed: rank 0 let it finish
          }
          aborter.join();
          return;
        }
        const pid_t peer = pid_t(std::stoll(store->get_string("pid1")));
        bool caught = false;
        for (int a = 0; a < kAttempts && !caught; ++a) {
          Tensor t = Tensor::zeros({kElements}, DType::kF32);
          Work w = comm->broadcast(t, {.root = 1});
          while (word_at(t, 0) == 0 && !w.done()) std::this_thread::yield();
          ::kill(peer, SIGSTOP);
          while (!stopped(peer)) std::this_thread::sleep_for(1ms);
          caught = word_at(t, kElements - 1) == 0 && !w.done();
          store->set_string("caught" + std::to_string(a), caught ? "1" : "0");
          if (!caught) {
            ::kill(peer, SIGCONT);
            w.wait();
            continue;
          }
          if (kill_sender) ::kill(peer, SIGKILL);
          std::thread aborter([&] { comm->abort("rank 0 aborted midway"); });
          expect_aborted(w, "rank 0 aborted midway");
          aborter.join();
        }
        EXPECT_TRUE(caught) << "no transfer was frozen midway in " << kAttempts << " attempts";
        if (kill_sender && caught) return;
        store->set_string("abort1", "1");
        ::kill(peer, SIGCONT);
      },
      {.deadline = 110s});
}

TEST(GlooAbortMidway, AnAbortEndsAReceiveWhoseBytesAreOnTheWire) {
  test::RunResult result = run_midway(false);
  EXPECT_TRUE(result.ok()) << result.summary();
}

// The node-loss case: the sender dies mid-message. Its connection's end alone does not fail
// the receive (the stall seen after a node loss: rank 0 receiving from the lost rank); the
// abort that follows the loss must.
TEST(GlooAbortMidway, AnAbortEndsAReceiveFromAPeerKilledMidMessage) {
  test::RunResult result = run_midway(true);
  ASSERT_EQ(result.ranks.size(), 2u);
  EXPECT_TRUE(result.ranks[0].ok()) << result.summary();
  EXPECT_EQ(result.ranks[1].status, test::RankStatus::kSignaled) << result.summary();
  EXPECT_EQ(result.ranks[1].signal, SIGKILL) << result.summary();
}

}  // namespace
}  // namespace weft::comm

#endif
