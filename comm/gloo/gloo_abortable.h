// AbortableContext: a Gloo context whose transfers an abort ends at once, including the two
// that Gloo's TCP transport leaves to their timeouts.
//
// Why: when a connection ends (a peer lost, or GlooLinks::shut_down), the TCP pair fails the
// operations queued on it, but not the receive whose bytes its event loop is reading (Gloo's
// Pair::signalException walks the pending queues, not the message in rx_). That waitRecv then
// ran on to the collective's timeout: after a node loss, a survivor receiving a large message
// from a peer sat in an aborted world's collective for the whole 60 s. Gloo's only way to end
// such a wait is the buffer's abortWaitRecv (abortWaitSend for sends), and the collectives
// create their buffers (scratch included) through the context; so this context hands out
// buffers it tracks, and abort() interrupts every wait on them, sends included.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

namespace weft::comm {

// The buffers of one context that are alive now, and whether the context was aborted.
class BufferRegistry {
 public:
  explicit BufferRegistry(std::string abort_message) : message_(std::move(abort_message)) {}
  void add(gloo::transport::UnboundBuffer* inner);
  void remove(gloo::transport::UnboundBuffer* inner);
  // Every wait on a tracked buffer, now and later, fails with gloo::IoException(message).
  void abort() noexcept;
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  const std::string& message() const { return message_; }

 private:
  const std::string message_;
  std::mutex mu_;
  std::atomic<bool> aborted_{false};  // read on every wait: no lock there
  std::unordered_set<gloo::transport::UnboundBuffer*> live_;
};

class AbortableContext final : public gloo::rendezvous::Context {
 public:
  // `abort_message` is what interrupted waits throw (the communicator classifies it).
  AbortableContext(int rank, int size, std::string abort_message);
  // Call once, right after connectFullMesh: from then on every buffer is tracked.
  void track_buffers();
  // Ends every wait on this context's buffers, in flight or to come. Thread-safe, noexcept.
  void abort_transfers() noexcept { registry_->abort(); }

 private:
  std::shared_ptr<BufferRegistry> registry_;
};

}  // namespace weft::comm
