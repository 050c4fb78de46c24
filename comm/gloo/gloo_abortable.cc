// AbortableContext: the transport context is wrapped so that every unbound buffer it creates
// is a TrackedBuffer, which forwards to Gloo's own buffer and registers it for abort().
#include "comm/gloo/gloo_abortable.h"

#include <gloo/common/error.h>

#include "base/check.h"

namespace weft::comm {

namespace {

using gloo::transport::UnboundBuffer;

// Forwards every operation to the transport's buffer (the pairs see only that one). A wait
// that abort() interrupts, or one started after it, throws instead of returning false: the
// collectives ignore waitRecv's result and would go on with a buffer that never filled.
class TrackedBuffer final : public UnboundBuffer {
 public:
  TrackedBuffer(std::unique_ptr<UnboundBuffer> inner, std::shared_ptr<BufferRegistry> registry)
      : UnboundBuffer(inner->ptr, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)) {
    registry_->add(inner_.get());
  }
  ~TrackedBuffer() override { registry_->remove(inner_.get()); }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    throw_if_aborted();
    if (!inner_->waitRecv(rank, timeout)) throw gloo::IoException(registry_->message());
    return true;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    throw_if_aborted();
    if (!inner_->waitSend(rank, timeout)) throw gloo::IoException(registry_->message());
    return true;
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    throw_if_aborted();
    inner_->send(dst, slot, offset, nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    throw_if_aborted();
    inner_->recv(src, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override {
    throw_if_aborted();
    inner_->recv(std::move(srcs), slot, offset, nbytes);
  }

 private:
  void throw_if_aborted() const {
    if (registry_->aborted()) throw gloo::IoException(registry_->message());
  }

  std::unique_ptr<UnboundBuffer> inner_;
  std::shared_ptr<BufferRegistry> registry_;
};

// The transport's context with its buffers tracked; pairs are the transport's own.
class TrackingTransportContext final : public gloo::transport::Context {
 public:
  TrackingTransportContext(std::shared_ptr<gloo::transport::Context> inner,
                           std::shared_ptr<BufferRegistry> registry)
      : gloo::transport::Context(inner->rank, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)) {
    setTimeout(inner_->getTimeout());
  }
  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override {
    return inner_->getPair(rank);
  }
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override {
    return inner_->createPair(rank);
  }
  std::unique_ptr<UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override {
    return std::make_unique<TrackedBuffer>(inner_->createUnboundBuffer(ptr, size), registry_);
  }

 private:
  std::shared_ptr<gloo::transport::Context> inner_;
  std::shared_ptr<BufferRegistry> registry_;
};

}  // namespace

void BufferRegistry::add(UnboundBuffer* inner) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.insert(inner);
}

void BufferRegistry::remove(UnboundBuffer* inner) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(inner);
}

void BufferRegistry::abort() noexcept {
  // Under the lock, so no buffer is destroyed while it is being interrupted. Its flags stay
  // set until its next wait (Gloo resets them there), so a wait that starts after this
  // returns at once, and TrackedBuffer turns that into the abort's exception.
  std::lock_guard<std::mutex> lock(mu_);
  aborted_.store(true, std::memory_order_release);
  for (UnboundBuffer* b : live_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

AbortableContext::AbortableContext(int rank, int size, std::string abort_message)
    : gloo::rendezvous::Context(rank, size),
      registry_(std::make_shared<BufferRegistry>(std::move(abort_message))) {}

void AbortableContext::track_buffers() {
  WEFT_CHECK(transportContext_ != nullptr, "gloo: track_buffers before connectFullMesh");
  transportContext_ = std::make_shared<TrackingTransportContext>(transportContext_, registry_);
}

}  // namespace weft::comm
