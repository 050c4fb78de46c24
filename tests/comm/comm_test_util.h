// Shared by the communicator tests (fork-based Gloo, in-process, mpirun, loopback): inputs that
// every rank can compute for every other rank, the expected result of each collective computed
// locally from them (ggml's test-backend-ops idea: every backend against a readable
// reference), and the suite that runs every collective on every dtype and size.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/communicator.h"
#include "core/tensor.h"

namespace weft::comm::testing {

using core::DType;
using core::Tensor;

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> kTypes = {DType::kF32, DType::kF64, DType::kBF16,
                                            DType::kI32, DType::kI64, DType::kU8};
  return kTypes;
}

// Small non-negative integers: exact in every dtype, their sums over 4 ranks too (u8 <= 60,
// bf16 has 8 significant bits). `salt` varies the pattern between calls.
inline double input_value(int rank, int64_t i, int salt) {
  return double((rank * 7 + i * 3 + salt) % 13);
}

inline Tensor make_tensor(DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::empty({int64_t(values.size())}, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        t.data<float>()[i] = float(values[i]);
        break;
      case DType::kF64:
        t.data<double>()[i] = values[i];
        break;
      case DType::kBF16:
        t.data<core::bf16>()[i] = core::float_to_bf16(float(values[i]));
        break;
      case DType::kI32:
        t.data<int32_t>()[i] = int32_t(values[i]);
        break;
      case DType::kI64:
        t.data<int64_t>()[i] = int64_t(values[i]);
        break;
      case DType::kU8:
        t.data<uint8_t>()[i] = uint8_t(values[i]);
        break;
    }
  }
  return t;
}

inline Tensor rank_input(DType dtype, int64_t n, int rank, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = input_value(rank, i, salt);
  return make_tensor(dtype, v);
}

inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.item_at(i);
  return v;
}

// The reduction of all ranks' element i as the backend must produce it: integer sums exact,
// avg divided in the dtype's own arithmetic (f32 for bf16 and f32, truncation for integers).
inline double expected_reduce(DType dtype, ReduceOp op, int world, int64_t i, int salt) {
  double acc = input_value(0, i, salt);
  for (int r = 1; r < world; ++r) {
    double v = input_value(r, i, salt);
    acc = op == ReduceOp::kMax   ? std::max(acc, v)
          : op == ReduceOp::kMin ? std::min(acc, v)
                                 : acc + v;
  }
  if (op != ReduceOp::kAvg) return acc;
  switch (dtype) {
    case DType::kF32:
      return double(float(acc) / float(world));
    case DType::kF64:
      return acc / world;
    case DType::kBF16:
      return double(core::bf16_to_float(core::float_to_bf16(float(acc) / float(world))));
    default:
      return double(int64_t(acc) / world);
  }
}

// Element j of the part that `src` sends to `dst` in all_to_all_v.
inline double a2a_value(int src, int dst, int64_t j) {
  return double((src * 5 + dst * 3 + j) % 11);
}
// How many elements `src` sends to `dst`: uneven, some zero.
inline int64_t a2a_count(int src, int dst, int64_t base) { return (src + 2 * dst + base) % 4; }

inline std::string label(DType dtype, int64_t n, const char* what) {
  return std::string(what) + " " + core::dtype_name(dtype) + "[" + std::to_string(n) + "]";
}

inline void check_values(const Tensor& got, const std::vector<double>& want,
                         const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(want.size())) << what;
  std::vector<double> v = values_of(got);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(v[i], want[i]) << what << " element " << i;
}

// Every collective, every dtype, sizes 0, 1, odd and larger, on any communicator. Every rank
// must call it (the call sequence is identical on all ranks).
inline void run_collective_suite(Communicator& comm, bool with_self_p2p = true) {
  const int world = comm.size(), me = comm.rank();
  int salt = 0;
  for (DType dtype : all_dtypes()) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1001)}) {
      // all_reduce, each op
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        ++salt;
        Tensor t = rank_input(dtype, n, me, salt);
        comm.all_reduce(t, {.op = op}).wait();
        std::vector<double> want(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
          want[size_t(i)] = expected_reduce(dtype, op, world, i, salt);
        check_values(t, want, label(dtype, n, reduce_op_name(op)) + " all_reduce");
      }
      // reduce_scatter, balanced (uneven when world does not divide n) and explicit counts
      for (bool explicit_counts : {false, true}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          ++salt;
          std::vector<int64_t> counts(static_cast<size_t>(world));
          for (int r = 0; r < world; ++r)
            counts[size_t(r)] =
                explicit_counts ? (r == 1 ? 0 : (n + r) % 5) : n / world + (r < n % world ? 1 : 0);
          int64_t total = 0, offset = 0;
          for (int r = 0; r < world; ++r) {
            if (r == me) offset = total;
            total += counts[size_t(r)];
          }
          Tensor in = rank_input(dtype, total, me, salt);
          Tensor out = Tensor::empty({counts[size_t(me)]}, dtype);
          ReduceScatterOptions o{.op = op};
          if (explicit_counts) o.counts = counts;
          comm.reduce_scatter(out, in, o).wait();
          std::vector<double> want(static_cast<size_t>(counts[size_t(me)]));
          for (int64_t i = 0; i < counts[size_t(me)]; ++i)
            want[size_t(i)] = expected_reduce(dtype, op, world, offset + i, salt);
          check_values(out, want, label(dtype, total, reduce_op_name(op)) + " reduce_scatter");
          check_values(in, values_of(rank_input(dtype, total, me, salt)),
                       label(dtype, total, "input left unchanged by") + " reduce_scatter");
        }
      }
      // all_gather, equal and uneven contributions
      for (bool uneven : {false, true}) {
        ++salt;
        std::vector<int64_t> counts(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) counts[size_t(r)] = uneven ? (n + 2 * r) % 6 : n;
        int64_t total = 0;
        for (int64_t c : counts) total += c;
        Tensor in = rank_input(dtype, counts[size_t(me)], me, salt);
        Tensor out = Tensor::empty({total}, dtype);
        AllGatherOptions o;
        if (uneven) o.counts = counts;
        comm.all_gather(out, in, o).wait();
        std::vector<double> want;
        for (int r = 0; r < world; ++r)
          for (int64_t i = 0; i < counts[size_t(r)]; ++i) want.push_back(input_value(r, i, salt));
        check_values(out, want, label(dtype, total, uneven ? "uneven all_gather" : "all_gather"));
      }
      // broadcast from every root
      for (int root = 0; root < world; ++root) {
        ++salt;
        Tensor t = rank_input(dtype, n, me, salt);
        comm.broadcast(t, {.root = root}).wait();
        check_values(t, values_of(rank_input(dtype, n, root, salt)),
                     label(dtype, n, "broadcast from ") + std::to_string(root));
      }
      // all_to_all_v with uneven per-peer counts (some zero)
      {
        std::vector<int64_t> in_counts(static_cast<size_t>(world)),
            out_counts(static_cast<size_t>(world));
        std::vector<double> in_values, want;
        for (int p = 0; p < world; ++p) {
          in_counts[size_t(p)] = a2a_count(me, p, n);
          out_counts[size_t(p)] = a2a_count(p, me, n);
          for (int64_t j = 0; j < in_counts[size_t(p)]; ++j)
            in_values.push_back(a2a_value(me, p, j));
          for (int64_t j = 0; j < out_counts[size_t(p)]; ++j) want.push_back(a2a_value(p, me, j));
        }
        Tensor in = make_tensor(dtype, in_values);
        Tensor out = Tensor::empty({int64_t(want.size())}, dtype);
        comm.all_to_all_v(out, out_counts, in, in_counts).wait();
        check_values(out, want, label(dtype, int64_t(in_values.size()), "all_to_all_v"));
      }
      // send/recv around a ring, both posted before either is waited on
      {
        ++salt;
        const int next = (me + 1) % world, prev = (me + world - 1) % world;
        Tensor out = rank_input(dtype, n, me, salt);
        Tensor in = Tensor::empty({n}, dtype);
        Work s = comm.send(out, next, {.tag = 5});
        Work r = comm.recv(in, prev, {.tag = 5});
        r.wait();
        s.wait();
        check_values(in, values_of(rank_input(dtype, n, prev, salt)), label(dtype, n, "ring recv"));
        if (with_self_p2p) {
          Tensor self_in = Tensor::empty({n}, dtype);
          Work rs = comm.recv(self_in, me, {.tag = 9});
          comm.send(out, me, {.tag = 9}).wait();
          rs.wait();
          check_values(self_in, values_of(out), label(dtype, n, "recv from self"));
        }
      }
    }
  }
  comm.barrier().wait();
}

// Returns the error a Work reported ("" when it succeeded) and checks that a communication
// failure is one the elastic path handles: PeerLostError or TimeoutError.
inline std::string wait_for_peer_failure(const Work& w) {
  try {
    w.wait();
  } catch (const PeerLostError& e) {
    return std::string("PeerLostError: ") + e.what();
  } catch (const TimeoutError& e) {
    return std::string("TimeoutError: ") + e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected PeerLostError or TimeoutError, got: " << e.what();
    return std::string("other: ") + e.what();
  }
  ADD_FAILURE() << "the operation succeeded although a peer was gone";
  return "";
}

}  // namespace weft::comm::testing
