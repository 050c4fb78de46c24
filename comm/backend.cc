// Backend: argument checks and failure state shared by every backend, plus the helpers the
// backends have in common (counts, split planning, messages to oneself).
#include "comm/backend.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>

#include "base/check.h"
#include "base/error.h"

namespace weft::comm {

namespace {

bool supported_dtype(core::DType t) {
  switch (t) {
    case core::DType::kF32:
    case core::DType::kF64:
    case core::DType::kBF16:
    case core::DType::kI32:
    case core::DType::kI64:
    case core::DType::kU8:
      return true;
  }
  return false;
}

void check_counts(const std::vector<int64_t>& counts, int size, int64_t numel, const char* what) {
  WEFT_CHECK(int(counts.size()) == size, what, ": ", counts.size(), " counts for a world of ",
             size);
  int64_t total = 0;
  for (int64_t c : counts) {
    WEFT_CHECK(c >= 0, what, ": negative count ", c);
    total += c;
  }
  WEFT_CHECK(total == numel, what, ": counts add up to ", total, ", the tensor has ", numel,
             " elements");
}

void check_tensor(const core::Tensor& t, const char* what) {
  WEFT_CHECK(t.defined(), what, ": undefined tensor");
  WEFT_CHECK(t.is_contiguous(), what, ": tensor must be contiguous");
  WEFT_CHECK(supported_dtype(t.dtype()), what, ": unsupported dtype ", core::dtype_name(t.dtype()));
}

Millis resolve(const std::optional<Millis>& t, Millis fallback, const char* what) {
  Millis v = t.value_or(fallback);
  WEFT_CHECK(v.count() > 0, what, ": timeout must be positive, got ", v.count(), " ms");
  return v;
}

}  // namespace

const char* backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kLoopback:
      return "loopback";
    case BackendKind::kGloo:
      return "gloo";
    case BackendKind::kMpi:
      return "mpi";
    case BackendKind::kNccl:
      return "nccl";
  }
  return "?";
}

Backend::Backend(BackendKind kind, int rank, int size, Millis timeout)
    : kind_(kind), rank_(rank), size_(size), timeout_(timeout) {
  WEFT_CHECK(size >= 1 && rank >= 0 && rank < size, backend_name(kind), ": rank ", rank,
             " of a world of ", size);
  WEFT_CHECK(timeout.count() > 0, backend_name(kind), ": timeout must be positive");
}

void Backend::check_buffer(const core::Tensor& tensor, const char* what) const {
  WEFT_CHECK(tensor.device().is_cpu(), describe(what), ": tensor on ", tensor.device().to_string(),
             ", this backend moves host memory");
}

void Backend::set_failed(std::exception_ptr error) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_) failure_ = std::move(error);
}

std::exception_ptr Backend::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_error_ ? abort_error_ : failure_;
}

std::string Backend::describe(const char* op, const core::Tensor* tensor) const {
  std::string s = str(backend_name(kind_), " ", op);
  if (tensor && tensor->defined())
    s += str(" ", core::dtype_name(tensor->dtype()), core::shape_str(tensor->shape()));
  return s + str(" rank ", rank_, "/", size_);
}

void Backend::abort(const std::string& reason) noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_error_) return;
      abort_error_ =
          std::make_exception_ptr(CommError(str(describe("communicator"), " aborted: ", reason)));
      aborted_.store(true);
    }
    do_abort(reason);
  } catch (...) {
    // abort() is noexcept by contract; a failure to allocate the message leaves the
    // communicator to fail by its timeouts instead.
  }
}

template <typename Fn>
Work Backend::guarded(Fn&& fn) {
  if (std::exception_ptr e = failure()) return Work::failed(e);
  try {
    return fn();
  } catch (const CommError&) {
    // Communication errors surface from Work::wait(), never from the call.
    set_failed(std::current_exception());
    return Work::failed(std::current_exception());
  }
}

Work Backend::all_reduce(const core::Tensor& tensor, const AllReduceOptions& opts) {
  check_tensor(tensor, "all_reduce");
  check_buffer(tensor, "all_reduce");
  Millis timeout = resolve(opts.timeout, timeout_, "all_reduce");
  return guarded([&] { return do_all_reduce(tensor, opts.op, timeout); });
}

Work Backend::reduce_scatter(const core::Tensor& output, const core::Tensor& input,
                             const ReduceScatterOptions& opts) {
  check_tensor(output, "reduce_scatter output");
  check_tensor(input, "reduce_scatter input");
  check_buffer(output, "reduce_scatter");
  check_buffer(input, "reduce_scatter");
  WEFT_CHECK(output.dtype() == input.dtype(), "reduce_scatter: output is ",
             core::dtype_name(output.dtype()), ", input is ", core::dtype_name(input.dtype()));
  std::vector<int64_t> counts =
      opts.counts.empty() ? balanced_counts(input.numel(), size_) : opts.counts;
  check_counts(counts, size_, input.numel(), "reduce_scatter");
  WEFT_CHECK(output.numel() == counts[rank_], "reduce_scatter: rank ", rank_, " receives ",
             counts[rank_], " elements, output has ", output.numel());
  Millis timeout = resolve(opts.timeout, timeout_, "reduce_scatter");
  return guarded([&] { return do_reduce_scatter(output, input, opts.op, counts, timeout); });
}

Work Backend::all_gather(const core::Tensor& output, const core::Tensor& input,
                         const AllGatherOptions& opts) {
  check_tensor(output, "all_gather output");
  check_tensor(input, "all_gather input");
  check_buffer(output, "all_gather");
  check_buffer(input, "all_gather");
  WEFT_CHECK(output.dtype() == input.dtype(), "all_gather: output is ",
             core::dtype_name(output.dtype()), ", input is ", core::dtype_name(input.dtype()));
  std::vector<int64_t> counts =
      opts.counts.empty() ? std::vector<int64_t>(size_, input.numel()) : opts.counts;
  check_counts(counts, size_, output.numel(), "all_gather");
  WEFT_CHECK(counts[rank_] == input.numel(), "all_gather: rank ", rank_, " contributes ",
             counts[rank_], " elements, input has ", input.numel());
  Millis timeout = resolve(opts.timeout, timeout_, "all_gather");
  return guarded([&] { return do_all_gather(output, input, counts, timeout); });
}

Work Backend::broadcast(const core::Tensor& tensor, const BroadcastOptions& opts) {
  check_tensor(tensor, "broadcast");
  check_buffer(tensor, "broadcast");
  WEFT_CHECK(opts.root >= 0 && opts.root < size_, "broadcast: root ", opts.root,
             " outside a world of ", size_);
  Millis timeout = resolve(opts.timeout, timeout_, "broadcast");
  return guarded([&] { return do_broadcast(tensor, opts.root, timeout); });
}

Work Backend::all_to_all_v(const core::Tensor& output, const std::vector<int64_t>& output_counts,
                           const core::Tensor& input, const std::vector<int64_t>& input_counts,
                           const AllToAllOptions& opts) {
  check_tensor(output, "all_to_all_v output");
  check_tensor(input, "all_to_all_v input");
  check_buffer(output, "all_to_all_v");
  check_buffer(input, "all_to_all_v");
  WEFT_CHECK(output.dtype() == input.dtype(), "all_to_all_v: output is ",
             core::dtype_name(output.dtype()), ", input is ", core::dtype_name(input.dtype()));
  check_counts(output_counts, size_, output.numel(), "all_to_all_v output");
  check_counts(input_counts, size_, input.numel(), "all_to_all_v input");
  WEFT_CHECK(input_counts[rank_] == output_counts[rank_], "all_to_all_v: rank ", rank_, " keeps ",
             input_counts[rank_], " elements but receives ", output_counts[rank_], " from itself");
  Millis timeout = resolve(opts.timeout, timeout_, "all_to_all_v");
  return guarded(
      [&] { return do_all_to_all_v(output, output_counts, input, input_counts, timeout); });
}

Work Backend::send(const core::Tensor& tensor, int peer, const SendOptions& opts) {
  check_tensor(tensor, "send");
  check_buffer(tensor, "send");
  WEFT_CHECK(peer >= 0 && peer < size_, "send: peer ", peer, " outside a world of ", size_);
  WEFT_CHECK(opts.tag >= 0 && opts.tag <= kMaxTag, "send: tag ", opts.tag, " outside [0, ", kMaxTag,
             "]");
  Millis timeout = resolve(opts.timeout, timeout_, "send");
  return guarded([&] { return do_send(tensor, peer, opts.tag, timeout); });
}

Work Backend::recv(const core::Tensor& tensor, int peer, const RecvOptions& opts) {
  check_tensor(tensor, "recv");
  check_buffer(tensor, "recv");
  WEFT_CHECK(peer >= 0 && peer < size_, "recv: peer ", peer, " outside a world of ", size_);
  WEFT_CHECK(opts.tag >= 0 && opts.tag <= kMaxTag, "recv: tag ", opts.tag, " outside [0, ", kMaxTag,
             "]");
  Millis timeout = resolve(opts.timeout, timeout_, "recv");
  return guarded([&] { return do_recv(tensor, peer, opts.tag, timeout); });
}

Work Backend::barrier(const BarrierOptions& opts) {
  Millis timeout = resolve(opts.timeout, timeout_, "barrier");
  return guarded([&] { return do_barrier(timeout); });
}

std::unique_ptr<Communicator> Backend::split(int color, int key, const SplitOptions& opts) {
  Millis timeout = resolve(opts.timeout, timeout_, "split");
  if (std::exception_ptr e = failure()) std::rethrow_exception(e);
  try {
    return do_split(color < 0 ? kNoColor : color, key, timeout);
  } catch (const CommError&) {
    set_failed(std::current_exception());
    throw;
  }
}

std::vector<int64_t> balanced_counts(int64_t numel, int parts) {
  std::vector<int64_t> counts(size_t(parts), numel / parts);
  for (int64_t i = 0; i < numel % parts; ++i) counts[size_t(i)] += 1;
  return counts;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

void copy_bytes(const core::Tensor& dst, const core::Tensor& src) {
  WEFT_CHECK(dst.nbytes() == src.nbytes(), "copy_bytes: ", dst.nbytes(), " vs ", src.nbytes());
  if (dst.nbytes() && dst.raw_data() != src.raw_data())
    std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
}

SplitPlan plan_split(const std::vector<int64_t>& color_key_by_rank, int my_rank) {
  WEFT_CHECK(color_key_by_rank.size() % 2 == 0, "plan_split: odd exchange");
  const int world = int(color_key_by_rank.size() / 2);
  SplitPlan plan;
  plan.color = int(color_key_by_rank[size_t(2 * my_rank)]);
  if (plan.color < 0) return plan;
  std::vector<std::pair<int64_t, int>> keyed;  // (key, old rank): ties go to the old rank
  for (int r = 0; r < world; ++r)
    if (color_key_by_rank[size_t(2 * r)] == plan.color)
      keyed.emplace_back(color_key_by_rank[size_t(2 * r + 1)], r);
  std::sort(keyed.begin(), keyed.end());
  for (const auto& [key, r] : keyed) {
    if (r == my_rank) plan.rank = int(plan.members.size());
    plan.members.push_back(r);
  }
  return plan;
}

SplitPlan exchange_split(Communicator& parent, int color, int key, Millis timeout) {
  core::Tensor mine = core::Tensor::from_vector<int64_t>({2}, {color, key});
  core::Tensor all = core::Tensor::empty({2 * int64_t(parent.size())}, core::DType::kI64);
  AllGatherOptions opts;
  opts.timeout = timeout;
  parent.all_gather(all, mine, opts).wait();
  return plan_split(all.to_vector<int64_t>(), parent.rank());
}

struct SelfMailbox::State {
  struct PendingRecv {
    core::Tensor tensor;
    std::shared_ptr<Completion> completion;
  };
  std::string owner;
  std::mutex mu;
  std::map<int, std::deque<std::vector<uint8_t>>> messages;
  std::map<int, std::deque<PendingRecv>> receivers;

  std::exception_ptr mismatch(int tag, size_t want, size_t got) const {
    return std::make_exception_ptr(CommError(str(owner, ": recv from self (tag ", tag, ") expects ",
                                                 want, " bytes, the send has ", got)));
  }
};

namespace {

// A pending recv from oneself. It expires under the mailbox's lock, so a send either
// delivers into it before that or finds it gone: the tensor is never written after the
// recv has failed.
class SelfRecvWork : public WorkImpl {
 public:
  SelfRecvWork(std::shared_ptr<SelfMailbox::State> state, int tag,
               std::shared_ptr<Completion> completion, Clock::time_point expires, Millis timeout)
      : state_(std::move(state)),
        tag_(tag),
        completion_(std::move(completion)),
        expires_(expires),
        timeout_(timeout) {}

  bool done() override {
    if (!completion_->finished() && Clock::now() >= expires_) expire();
    return completion_->finished();
  }

  void wait_until(std::optional<Clock::time_point> deadline) override {
    const bool user_first = deadline && *deadline < expires_;
    if (!completion_->await(user_first ? *deadline : expires_)) {
      if (user_first) return completion_->wait_until(deadline);  // throws the wait's timeout
      expire();
    }
    completion_->wait_until(std::nullopt);
  }

 private:
  void expire() {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (completion_->finished()) return;
    auto& queue = state_->receivers[tag_];
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->completion == completion_) {
        queue.erase(it);
        break;
      }
    }
    completion_->fail(std::make_exception_ptr(
        TimeoutError(str(state_->owner, ": recv from self (tag ", tag_, ") got no message within ",
                         timeout_.count(), " ms"))));
  }

  std::shared_ptr<SelfMailbox::State> state_;
  int tag_;
  std::shared_ptr<Completion> completion_;
  Clock::time_point expires_;
  Millis timeout_;
};

}  // namespace

SelfMailbox::SelfMailbox(std::string owner) : state_(std::make_shared<State>()) {
  state_->owner = std::move(owner);
}

Work SelfMailbox::send(const core::Tensor& tensor, int tag) {
  const auto* p = static_cast<const uint8_t*>(tensor.raw_data());
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->receivers.find(tag);
  if (it == state_->receivers.end() || it->second.empty()) {
    state_->messages[tag].emplace_back(p, p + tensor.nbytes());
    return Work::completed();
  }
  State::PendingRecv receiver = std::move(it->second.front());
  it->second.pop_front();
  if (receiver.tensor.nbytes() != tensor.nbytes()) {
    receiver.completion->fail(state_->mismatch(tag, receiver.tensor.nbytes(), tensor.nbytes()));
  } else {
    if (tensor.nbytes()) std::memcpy(receiver.tensor.raw_data(), p, tensor.nbytes());
    receiver.completion->complete();
  }
  return Work::completed();
}

Work SelfMailbox::recv(const core::Tensor& tensor, int tag, Millis timeout) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->messages.find(tag);
  if (it == state_->messages.end() || it->second.empty()) {
    auto completion =
        std::make_shared<Completion>(str(state_->owner, " recv from self, tag ", tag));
    state_->receivers[tag].push_back({tensor, completion});
    return Work(
        std::make_shared<SelfRecvWork>(state_, tag, completion, Clock::now() + timeout, timeout));
  }
  std::vector<uint8_t> bytes = std::move(it->second.front());
  it->second.pop_front();
  if (bytes.size() != tensor.nbytes())
    return Work::failed(state_->mismatch(tag, tensor.nbytes(), bytes.size()));
  if (!bytes.empty()) std::memcpy(tensor.raw_data(), bytes.data(), bytes.size());
  return Work::completed();
}

void SelfMailbox::fail_pending(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& [tag, queue] : state_->receivers)
    for (auto& r : queue) r.completion->fail(error);
  state_->receivers.clear();
}

}  // namespace weft::comm
