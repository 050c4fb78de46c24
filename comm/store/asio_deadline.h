// One asynchronous Asio/Beast operation run on the caller's thread until a deadline: the
// etcd client's requests and its watch stream do every step (resolve, connect, send,
// receive) this way, so that no step can outlast the time its caller has.
#pragma once

#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <optional>

namespace weft::comm {

// Queues an operation through `start(done)` and runs `io` until `done(ec)` is called or
// `deadline` passes. At the deadline `abort()` ends the operation (closes or cancels its
// socket, cancels a resolve); its handler then runs before this returns, while the result
// it writes is still alive, and the result is timed_out.
template <typename Start, typename Abort>
boost::system::error_code run_until_deadline(boost::asio::io_context& io, Start&& start,
                                             std::chrono::steady_clock::time_point deadline,
                                             Abort&& abort) {
  std::optional<boost::system::error_code> result;
  start([&result](boost::system::error_code ec) { result = ec; });
  io.restart();
  io.run_until(deadline);
  if (result) return *result;
  abort();
  io.restart();
  io.run();
  return boost::asio::error::timed_out;
}

}  // namespace weft::comm
