// GlooCommunicator: collectives run one at a time, in issue order, on a worker thread per
// communicator, so calls return at once and Work::wait(timeout) can give up. Point-to-point
// transfers are posted on the caller's thread (Gloo's unbound buffers are asynchronous) and
// a waiter thread per transfer completes their Work, so a send and a recv in flight at once
// cannot block each other behind one queue.
#include "comm/gloo/gloo_communicator.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/foreign_checks.h"
#include "comm/backend.h"
#include "comm/gloo/gloo_abortable.h"
#include "comm/gloo/gloo_links.h"
#include "comm/gloo/gloo_store.h"
#include "comm/gloo/thread_slice.h"
#include "comm/reduce.h"

namespace weft::comm {

namespace {

using detail::FailureKind;
using detail::ForeignFailure;

// Point-to-point slots: a prefix no Gloo collective uses (theirs are 0x01..0x08).
constexpr uint8_t kP2pSlotPrefix = 0xA7;
// Names failures that this side caused by tearing its connections down.
constexpr const char* kTeardownMarker = "weft: communicator torn down";
// Below this many bytes Gloo's bcube all-reduce (log steps) beats the ring (2(n-1) steps);
// above, the ring's pipelining wins. Measured with `weft bench comm` (its Gloo probe drives
// both on one transport; 2-core host, 127.0.0.1, f32, median of the slowest rank, seven runs):
// at 4 ranks bcube won every size from 16 KiB through 512 KiB in every run, by 1.1-2x (4 steps
// to the ring's 6, each a thread wake-up), and the ring caught up between 1 and 8 MiB, lower
// the quieter the machine; at 2 ranks the two were within noise. So 512 KiB, not 64 KiB.
constexpr size_t kBcubeMaxBytes = 512 * 1024;

// Gloo writes to its sockets with writev(2): when a peer has died, that raises SIGPIPE, whose
// default action kills this process instead of letting the write fail with EPIPE (which Gloo
// turns into an error). So the first Gloo communicator ignores SIGPIPE, unless the program
// installed a handler of its own.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

// Calls fn with a value of the unsigned type of `bytes` bytes: Gloo's algorithms only need the
// element size (the reduction is ours), so four instantiations cover every dtype.
template <typename Fn>
void with_element_type(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
  }
  WEFT_CHECK(false, "gloo: element size ", bytes);
}

class GlooCommunicator final : public Backend {
 public:
  explicit GlooCommunicator(const CommOptions& opts);
  ~GlooCommunicator() override;

 protected:
  Work do_all_reduce(const core::Tensor& tensor, ReduceOp op, Millis timeout) override;
  Work do_reduce_scatter(const core::Tensor& output, const core::Tensor& input, ReduceOp op,
                         const std::vector<int64_t>& counts, Millis timeout) override;
  Work do_all_gather(const core::Tensor& output, const core::Tensor& input,
                     const std::vector<int64_t>& counts, Millis timeout) override;
  Work do_broadcast(const core::Tensor& tensor, int root, Millis timeout) override;
  Work do_all_to_all_v(const core::Tensor& output, const std::vector<int64_t>& output_counts,
                       const core::Tensor& input, const std::vector<int64_t>& input_counts,
                       Millis timeout) override;
  Work do_send(const core::Tensor& tensor, int peer, int tag, Millis timeout) override;
  Work do_recv(const core::Tensor& tensor, int peer, int tag, Millis timeout) override;
  Work do_barrier(Millis timeout) override;
  std::unique_ptr<Communicator> do_split(int color, int key, Millis timeout) override;
  void do_abort(const std::string& reason) noexcept override;

 private:
  struct Op {
    std::shared_ptr<Completion> completion;
    std::function<void(uint32_t tag)> run;
    uint32_t tag = 0;
  };

  // Queues `run` behind earlier collectives; the tag is taken now, in issue order, so it is
  // the same on every rank.
  Work enqueue(std::string what, std::function<void(uint32_t tag)> run);
  void worker_loop();
  // Records the first failure, tears the transport down so peers and pending transfers fail
  // fast, and returns what the failed operation reports (an abort wins over its echo).
  std::exception_ptr fail_with(std::exception_ptr error) noexcept;
  // Shuts the connections down and interrupts every wait on a transfer, so that pending
  // transfers here and at the peers fail now.
  void teardown() noexcept;
  ForeignFailure classify(const std::string& message) const;
  Work watch_p2p(std::unique_ptr<gloo::transport::UnboundBuffer> buf, const core::Tensor& tensor,
                 bool is_send, Millis timeout, std::string what);
  // Runs `wait` on a waiter thread: an idle one, or a new one when every thread is blocked.
  void submit_wait(std::function<void()> wait);
  void waiter_loop();
  bool alone() const { return size() == 1; }

  CommOptions opts_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<AbortableContext> context_;
  std::unique_ptr<GlooLinks> links_;
  SelfMailbox mailbox_;
  int split_seq_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  uint32_t next_tag_ = 0;
  bool running_ = false;
  bool stopping_ = false;
  std::thread worker_;

  // Waiter threads for point-to-point transfers. A wait blocks until the peer matches the
  // transfer, so each transfer in flight needs a thread of its own (sharing one could wait on
  // a send while the receive the caller needs has long arrived); threads are kept for the next
  // transfer because creating one costs more than moving a small message (pipeline sends).
  std::mutex waiters_mu_;
  std::condition_variable waiters_cv_;
  std::deque<std::function<void()>> waits_;  // submitted, not yet taken by a thread
  int idle_waiters_ = 0;                     // threads blocked in waiters_cv_
  int waits_in_flight_ = 0;                  // submitted and not finished
  bool waiters_stop_ = false;
  std::vector<std::thread> waiter_threads_;
};

GlooCommunicator::GlooCommunicator(const CommOptions& opts)
    : Backend(BackendKind::kGloo, opts.rank, opts.size, opts.timeout),
      opts_(opts),
      mailbox_(describe("send/recv")) {
  if (!alone()) {
    ignore_sigpipe_once();
    // Before any thread of the communicator exists, so that the transport's event loop, the
    // worker and the waiters inherit it; the calling thread, which waits on every Work, keeps
    // it (thread_slice.h: each wake-up of a collective's chain otherwise waits, runnable,
    // behind a computing thread until that one's slice ends).
    set_thread_slice(kCommThreadSlice);
    WEFT_CHECK(opts.store != nullptr, "gloo: a world of ", size(), " needs CommOptions::store");
    auto classify_rendezvous = [&](const std::string& m) { return classify(m); };
    gloo::transport::tcp::attr attr;
    attr.hostname = opts.host;
    WEFT_GLOO_CHECK(device_ = gloo::transport::tcp::CreateDevice(attr), classify_rendezvous);
    auto context = std::make_shared<AbortableContext>(
        rank(), size(), str(kTeardownMarker, ": transfer interrupted"));
    context->setTimeout(opts.timeout);
    GlooStore store(*opts.store, opts.prefix + "/gloo", size());
    WEFT_GLOO_CHECK(context->connectFullMesh(store, device_), classify_rendezvous);
    context->track_buffers();
    context_ = context;
    links_ = std::make_unique<GlooLinks>(*context_, *opts.store, opts.prefix + "/gloo");
  }
  worker_ = std::thread(&GlooCommunicator::worker_loop, this);
}

GlooCommunicator::~GlooCommunicator() {
  bool busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    busy = running_ || !queue_.empty();
  }
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    busy = busy || waits_in_flight_ > 0;
  }
  // Pending operations fail (contract); tearing the pairs down releases the worker and the
  // waiters now instead of at their timeouts.
  if (busy) {
    set_failed(std::make_exception_ptr(
        CommError(describe("communicator") + " destroyed with operations pending")));
    teardown();
  }
  cv_.notify_all();
  worker_.join();
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    waiters_stop_ = true;  // threads leave once the queue is empty (teardown failed its waits)
  }
  waiters_cv_.notify_all();
  for (std::thread& t : waiter_threads_) t.join();
  mailbox_.fail_pending(std::make_exception_ptr(
      CommError(describe("communicator") + " destroyed with a recv from self pending")));
  links_.reset();
  context_.reset();
  device_.reset();
}

ForeignFailure GlooCommunicator::classify(const std::string& m) const {
  auto has = [&](const char* s) { return m.find(s) != std::string::npos; };
  if (has(kTeardownMarker)) return {FailureKind::kComm, -1};
  if (has("Timed out") || has("timeout")) return {FailureKind::kTimeout, -1};
  if (int peer = links_ ? links_->peer_in_message(m) : -1; peer >= 0)
    return {FailureKind::kPeerLost, peer};
  if (has("closed by peer") || has("Connection reset") || has("Socket closed") ||
      has("Broken pipe") || has("Read error") || has("writev") || has("Connection refused"))
    return {FailureKind::kPeerLost, links_ ? links_->lost_peer() : -1};
  return {FailureKind::kComm, -1};
}

void GlooCommunicator::teardown() noexcept {
  if (links_) links_->shut_down();
  // Shutting the connections down fails what is queued on them, but not a receive whose
  // bytes are on the wire (gloo_abortable.h): interrupt every wait on this context's buffers.
  if (context_) context_->abort_transfers();
}

std::exception_ptr GlooCommunicator::fail_with(std::exception_ptr error) noexcept {
  set_failed(error);
  teardown();
  return failure();
}

Work GlooCommunicator::enqueue(std::string what, std::function<void(uint32_t)> run) {
  auto completion = std::make_shared<Completion>(std::move(what));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({completion, std::move(run), next_tag_++});
  }
  cv_.notify_one();
  return Work(completion);
}

void GlooCommunicator::worker_loop() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        op.completion->fail(std::make_exception_ptr(
            CommError(describe("communicator") + " destroyed before the operation ran")));
        continue;
      }
      running_ = true;
    }
    if (std::exception_ptr e = failure()) {
      op.completion->fail(e);
    } else {
      try {
        op.run(op.tag);
        op.completion->complete();
      } catch (...) {
        op.completion->fail(fail_with(std::current_exception()));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
}

Work GlooCommunicator::do_all_reduce(const core::Tensor& tensor, ReduceOp op, Millis timeout) {
  if (alone() || tensor.numel() == 0) return Work::completed();
  return enqueue(describe("all_reduce", &tensor), [=, this](uint32_t tag) {
    const core::DType dtype = tensor.dtype();
    const ReduceOp reduce = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    gloo::AllreduceOptions o(context_);
    with_element_type(core::dtype_size(dtype), [&](auto t) {
      o.setOutput(static_cast<decltype(t)*>(tensor.raw_data()), size_t(tensor.numel()));
    });
    o.setReduceFunction([dtype, reduce](void* out, const void* a, const void* b, size_t n) {
      reduce_elements(out, a, b, n, dtype, reduce);
    });
    o.setAlgorithm(tensor.nbytes() <= kBcubeMaxBytes ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                     : gloo::AllreduceOptions::Algorithm::RING);
    o.setTag(tag);
    o.setTimeout(timeout);
    WEFT_GLOO_CHECK(gloo::allreduce(o), [this](const std::string& m) { return classify(m); });
    if (op == ReduceOp::kAvg)
      divide_elements(tensor.raw_data(), size_t(tensor.numel()), dtype, size());
  });
}

// Gloo's reduce-scatter (halving-doubling) is typed and knows no bf16; an all-reduce of a
// scratch copy and a slice costs twice the bytes but serves every dtype and uneven counts.
Work GlooCommunicator::do_reduce_scatter(const core::Tensor& output, const core::Tensor& input,
                                         ReduceOp op, const std::vector<int64_t>& counts,
                                         Millis timeout) {
  if (alone()) {
    copy_bytes(output, input);
    return Work::completed();
  }
  if (input.numel() == 0) return Work::completed();
  const int64_t offset = offsets_of(counts)[size_t(rank())];
  return enqueue(describe("reduce_scatter", &input), [=, this](uint32_t tag) {
    core::Tensor scratch = input.clone();
    const core::DType dtype = input.dtype();
    const ReduceOp reduce = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    gloo::AllreduceOptions o(context_);
    with_element_type(core::dtype_size(dtype), [&](auto t) {
      o.setOutput(static_cast<decltype(t)*>(scratch.raw_data()), size_t(scratch.numel()));
    });
    o.setReduceFunction([dtype, reduce](void* out, const void* a, const void* b, size_t n) {
      reduce_elements(out, a, b, n, dtype, reduce);
    });
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setTag(tag);
    o.setTimeout(timeout);
    WEFT_GLOO_CHECK(gloo::allreduce(o), [this](const std::string& m) { return classify(m); });
    core::Tensor mine = scratch.view({scratch.numel()}).slice(0, offset, output.numel());
    if (op == ReduceOp::kAvg) divide_elements(mine.raw_data(), size_t(mine.numel()), dtype, size());
    copy_bytes(output, mine);
  });
}

Work GlooCommunicator::do_all_gather(const core::Tensor& output, const core::Tensor& input,
                                     const std::vector<int64_t>& counts, Millis timeout) {
  if (alone()) {
    copy_bytes(output, input);
    return Work::completed();
  }
  if (output.numel() == 0) return Work::completed();
  return enqueue(describe("all_gather", &input), [=, this](uint32_t tag) {
    gloo::AllgathervOptions o(context_);
    std::vector<size_t> elements(counts.begin(), counts.end());
    with_element_type(core::dtype_size(input.dtype()), [&](auto t) {
      using T = decltype(t);
      o.setInput(static_cast<T*>(input.raw_data()), size_t(input.numel()));
      o.setOutput(static_cast<T*>(output.raw_data()), elements);
    });
    o.setTag(tag);
    o.setTimeout(timeout);
    WEFT_GLOO_CHECK(gloo::allgatherv(o), [this](const std::string& m) { return classify(m); });
  });
}

Work GlooCommunicator::do_broadcast(const core::Tensor& tensor, int root, Millis timeout) {
  if (alone() || tensor.numel() == 0) return Work::completed();
  return enqueue(describe("broadcast", &tensor), [=, this](uint32_t tag) {
    gloo::BroadcastOptions o(context_);
    with_element_type(core::dtype_size(tensor.dtype()), [&](auto t) {
      o.setOutput(static_cast<decltype(t)*>(tensor.raw_data()), size_t(tensor.numel()));
    });
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout);
    WEFT_GLOO_CHECK(gloo::broadcast(o), [this](const std::string& m) { return classify(m); });
  });
}

Work GlooCommunicator::do_all_to_all_v(const core::Tensor& output,
                                       const std::vector<int64_t>& output_counts,
                                       const core::Tensor& input,
                                       const std::vector<int64_t>& input_counts, Millis timeout) {
  if (alone()) {
    copy_bytes(output, input);
    return Work::completed();
  }
  return enqueue(describe("all_to_all_v", &input), [=, this](uint32_t tag) {
    gloo::AlltoallvOptions o(context_);
    with_element_type(core::dtype_size(input.dtype()), [&](auto t) {
      using T = decltype(t);
      o.setInput(static_cast<T*>(input.raw_data()), input_counts);
      o.setOutput(static_cast<T*>(output.raw_data()), output_counts);
    });
    o.setTag(tag);
    o.setTimeout(timeout);
    WEFT_GLOO_CHECK(gloo::alltoallv(o), [this](const std::string& m) { return classify(m); });
  });
}

Work GlooCommunicator::do_barrier(Millis timeout) {
  if (alone()) return Work::completed();
  return enqueue(describe("barrier"), [=, this](uint32_t tag) {
    gloo::BarrierOptions o(context_);
    o.setTag(tag);
    o.setTimeout(timeout);
    WEFT_GLOO_CHECK(gloo::barrier(o), [this](const std::string& m) { return classify(m); });
  });
}

Work GlooCommunicator::watch_p2p(std::unique_ptr<gloo::transport::UnboundBuffer> buf,
                                 const core::Tensor& tensor, bool is_send, Millis timeout,
                                 std::string what) {
  auto completion = std::make_shared<Completion>(std::move(what));
  std::shared_ptr<gloo::transport::UnboundBuffer> shared(std::move(buf));
  // The wait holds the tensor so its storage outlives the transfer whatever the caller does.
  submit_wait([this, shared, tensor, is_send, timeout, completion] {
    try {
      bool ok = false;
      auto classifier = [this](const std::string& m) { return classify(m); };
      if (is_send) {
        WEFT_GLOO_CHECK(ok = shared->waitSend(timeout), classifier);
      } else {
        WEFT_GLOO_CHECK(ok = shared->waitRecv(timeout), classifier);
      }
      if (!ok) throw CommError(str(kTeardownMarker, ": transfer interrupted"));
      completion->complete();
    } catch (...) {
      completion->fail(fail_with(std::current_exception()));
    }
  });
  return Work(completion);
}

void GlooCommunicator::submit_wait(std::function<void()> wait) {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  waits_.push_back(std::move(wait));
  ++waits_in_flight_;
  // Every queued wait needs a thread that is free to take it: idle threads count once each.
  if (idle_waiters_ < int(waits_.size()))
    waiter_threads_.emplace_back(&GlooCommunicator::waiter_loop, this);
  else
    waiters_cv_.notify_one();
}

void GlooCommunicator::waiter_loop() {
  std::unique_lock<std::mutex> lock(waiters_mu_);
  for (;;) {
    ++idle_waiters_;
    waiters_cv_.wait(lock, [&] { return !waits_.empty() || waiters_stop_; });
    --idle_waiters_;
    if (waits_.empty()) return;  // stopping
    std::function<void()> wait = std::move(waits_.front());
    waits_.pop_front();
    lock.unlock();
    wait();
    wait = nullptr;  // release the transfer's buffers before counting it finished
    lock.lock();
    --waits_in_flight_;
  }
}

Work GlooCommunicator::do_send(const core::Tensor& tensor, int peer, int tag, Millis timeout) {
  if (peer == rank()) return mailbox_.send(tensor, tag);
  auto buf = context_->createUnboundBuffer(tensor.raw_data(), tensor.nbytes());
  WEFT_GLOO_CHECK(buf->send(peer, gloo::Slot::build(kP2pSlotPrefix, uint32_t(tag))),
                  [this](const std::string& m) { return classify(m); });
  return watch_p2p(std::move(buf), tensor, true, timeout,
                   str(describe("send", &tensor), " to ", peer, " tag ", tag));
}

Work GlooCommunicator::do_recv(const core::Tensor& tensor, int peer, int tag, Millis timeout) {
  if (peer == rank()) return mailbox_.recv(tensor, tag, timeout);
  auto buf = context_->createUnboundBuffer(tensor.raw_data(), tensor.nbytes());
  WEFT_GLOO_CHECK(buf->recv(peer, gloo::Slot::build(kP2pSlotPrefix, uint32_t(tag))),
                  [this](const std::string& m) { return classify(m); });
  return watch_p2p(std::move(buf), tensor, false, timeout,
                   str(describe("recv", &tensor), " from ", peer, " tag ", tag));
}

// Each colour rendezvouses under its own key prefix, numbered by the parent's split count
// (identical on every rank because split is collective), so sub-groups never share keys.
std::unique_ptr<Communicator> GlooCommunicator::do_split(int color, int key, Millis timeout) {
  SplitPlan plan = exchange_split(*this, color, key, timeout);
  const int seq = split_seq_++;
  if (plan.color < 0) return nullptr;
  CommOptions sub = opts_;
  sub.rank = plan.rank;
  sub.size = int(plan.members.size());
  sub.prefix = str(opts_.prefix, "/split", seq, "/color", plan.color);
  return std::make_unique<GlooCommunicator>(sub);
}

void GlooCommunicator::do_abort(const std::string& reason) noexcept {
  teardown();
  mailbox_.fail_pending(failure());
  std::deque<Op> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
  }
  for (Op& op : queued) op.completion->fail(failure());
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& opts) {
  return std::make_unique<GlooCommunicator>(opts);
}

}  // namespace weft::comm
