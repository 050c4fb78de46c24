// Running a transfer plan: one rank walks its ops (rank_ops), packs each outgoing message
// from its source tensors, unpacks each incoming one into its destination tensors, and
// frees a wave's sources before the next wave allocates.
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "parallel/router.h"

namespace weft::parallel {

void copy_box(void* dst, const std::vector<int64_t>& dst_shape,
              const std::vector<int64_t>& dst_start, const void* src,
              const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_start,
              const std::vector<int64_t>& extent, size_t elem) {
  const size_t n = extent.size();
  if (n == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t e : extent)
    if (e <= 0) return;
  // Row-major strides in elements; rows of the innermost dim are contiguous.
  std::vector<int64_t> ds(n, 1), ss(n, 1);
  for (size_t d = n - 1; d > 0; --d)
    ds[d - 1] = ds[d] * dst_shape[d], ss[d - 1] = ss[d] * src_shape[d];
  const size_t row = size_t(extent[n - 1]) * elem;
  std::vector<int64_t> idx(n, 0);
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  while (true) {
    int64_t doff = 0, soff = 0;
    for (size_t d = 0; d < n; ++d)
      doff += (dst_start[d] + idx[d]) * ds[d], soff += (src_start[d] + idx[d]) * ss[d];
    std::memcpy(out + doff * int64_t(elem), in + soff * int64_t(elem), row);
    size_t d = n - 1;
    while (d-- > 0) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
    if (d == size_t(-1)) return;
  }
}

namespace {

std::vector<int64_t> local_coords(const StateBox& b, const std::vector<int64_t>& global) {
  std::vector<int64_t> out(global.size());
  for (size_t d = 0; d < global.size(); ++d) out[d] = global[d] - b.start[d] + b.local_start[d];
  return out;
}

// Copies transfer `t` between a local tensor of A (or a packed buffer) and one of B.
struct Endpoint {
  void* data;
  std::vector<int64_t> shape, start;
};

Endpoint src_end(const Layout& a, const Transfer& t, const std::vector<core::Tensor>& src) {
  const StateBox& sb = a.ranks[size_t(t.src)].boxes.at(size_t(t.src_box));
  const core::Tensor& x = src.at(size_t(sb.local));
  if (!x.defined())
    throw InternalError("router: source tensor " + std::to_string(sb.local) +
                        " was released before its last use");
  return {x.raw_data(), x.shape(), local_coords(sb, t.start)};
}

Endpoint dst_end(const Layout& b, const Transfer& t, const std::vector<core::Tensor>& dst) {
  const StateBox& db = b.ranks[size_t(t.dst)].boxes.at(size_t(t.dst_box));
  const core::Tensor& x = dst.at(size_t(db.local));
  WEFT_CHECK(x.defined(), "router: destination tensor ", db.local, " not allocated");
  return {x.raw_data(), x.shape(), local_coords(db, t.start)};
}

size_t elem_of(const Transfer& t) {
  int64_t n = 1;
  for (int64_t e : t.extent) n *= e;
  return size_t(t.bytes / std::max<int64_t>(1, n));
}

}  // namespace

std::vector<core::Tensor> run_transition(const TransferPlan& plan, const Layout& a, const Layout& b,
                                         int rank, std::vector<core::Tensor>& src,
                                         comm::Communicator& comm) {
  const RankLayout& ra = a.ranks.at(size_t(rank));
  const RankLayout& rb = b.ranks.at(size_t(rank));
  if (src.size() != ra.locals.size())
    throw InternalError("router: rank " + std::to_string(rank) + " passed " +
                        std::to_string(src.size()) + " source tensors, its layout has " +
                        std::to_string(ra.locals.size()));
  for (size_t l = 0; l < src.size(); ++l)
    if (src[l].defined() &&
        (src[l].shape() != ra.locals[l].shape || src[l].dtype() != ra.locals[l].dtype))
      throw InternalError("router: source tensor " + std::to_string(l) + " is " +
                          core::shape_str(src[l].shape()) + ", the layout says " +
                          core::shape_str(ra.locals[l].shape));
  for (size_t l = 0; l < src.size(); ++l) src[l] = src[l].defined() ? src[l].contiguous() : src[l];
  std::vector<core::Tensor> dst(rb.locals.size());
  core::Tensor send_buf, recv_buf;
  comm::Work send_work, recv_work;
  const Message* incoming = nullptr;
  for (const RankOp& op : rank_ops(plan, a, b, rank)) {
    switch (op.kind) {
      case RankOp::kAlloc:
        dst[size_t(op.index)] = core::Tensor::zeros(rb.locals[size_t(op.index)].shape,
                                                    rb.locals[size_t(op.index)].dtype);
        break;
      case RankOp::kCopy: {
        const Transfer& t = plan.transfers[size_t(op.index)];
        Endpoint s = src_end(a, t, src), d = dst_end(b, t, dst);
        copy_box(d.data, d.shape, d.start, s.data, s.shape, s.start, t.extent, elem_of(t));
        break;
      }
      case RankOp::kSend: {
        const Message& m =
            plan.waves[size_t(op.wave)].rounds[size_t(op.round)].messages[size_t(op.index)];
        send_buf = core::Tensor::empty({m.bytes}, core::DType::kU8);
        int64_t at = 0;
        for (int ti : m.transfers) {
          const Transfer& t = plan.transfers[size_t(ti)];
          Endpoint s = src_end(a, t, src);
          copy_box(send_buf.data<uint8_t>() + at, t.extent,
                   std::vector<int64_t>(t.extent.size(), 0), s.data, s.shape, s.start, t.extent,
                   elem_of(t));
          at += t.bytes;
        }
        send_work = comm.send(send_buf, m.dst, {.tag = op.round % (comm::kMaxTag + 1)});
        break;
      }
      case RankOp::kRecv: {
        incoming = &plan.waves[size_t(op.wave)].rounds[size_t(op.round)].messages[size_t(op.index)];
        recv_buf = core::Tensor::empty({incoming->bytes}, core::DType::kU8);
        recv_work = comm.recv(recv_buf, incoming->src, {.tag = op.round % (comm::kMaxTag + 1)});
        break;
      }
      case RankOp::kWait: {
        recv_work.wait();
        send_work.wait();
        if (incoming) {
          int64_t at = 0;
          for (int ti : incoming->transfers) {
            const Transfer& t = plan.transfers[size_t(ti)];
            Endpoint d = dst_end(b, t, dst);
            copy_box(d.data, d.shape, d.start, recv_buf.data<uint8_t>() + at, t.extent,
                     std::vector<int64_t>(t.extent.size(), 0), t.extent, elem_of(t));
            at += t.bytes;
          }
        }
        incoming = nullptr;
        send_buf = recv_buf = core::Tensor();
        send_work = recv_work = comm::Work();
        break;
      }
      case RankOp::kRelease:
        src[size_t(op.index)] = core::Tensor();
        break;
    }
  }
  return dst;
}

}  // namespace weft::parallel
