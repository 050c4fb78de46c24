// Upper bounds of the job spec's integer fields, and of the products of sizes that the code
// computes in int64: far above any real job, low enough that no size arithmetic overflows.
#pragma once

#include <cstdint>

namespace weft::core::limits {

// model. What does not fit memory is refused later, with the sizes, by the memory check
// (planner/memory_estimate.h); these bounds only keep sizes meaningful.
constexpr int64_t kMaxLayers = int64_t(1) << 20;
constexpr int64_t kMaxDim = int64_t(1) << 20;
constexpr int64_t kMaxHeads = int64_t(1) << 16;
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxSeqLen = int64_t(1) << 20;
constexpr int64_t kMaxMlpRatio = 64;
constexpr int64_t kMaxExperts = int64_t(1) << 16;

// train. Steps and step counters (warmup_steps, eval_every, log_every, checkpoint.every,
// snapshot.every) are at most 2^40, a trillion steps.
constexpr int64_t kMaxSteps = int64_t(1) << 40;
constexpr int64_t kMaxBatch = int64_t(1) << 20;  // global_batch, micro_batch (sequences)
constexpr int64_t kMaxThreads = 1024;            // train.threads
constexpr int64_t kMaxEvalBatches = int64_t(1) << 20;

// parallel: each degree (dp, tp, pp, ep), pipeline.micro_batches and virtual_stages.
constexpr int64_t kMaxDegree = int64_t(1) << 16;

// checkpoint.keep, snapshot.ec.{k,m}, elastic.{min,max}_nodes.
constexpr int64_t kMaxKeep = 1'000'000;
constexpr int64_t kMaxEcBlocks = 255;  // Reed-Solomon over GF(2^8): k + m <= 255
constexpr int64_t kMaxNodes = int64_t(1) << 16;
// elastic.transfer_connections: each is a Gloo context (a socket per peer and two threads) per
// epoch; NCCL allows 64 sockets per peer, but past a core each few more buy nothing.
constexpr int64_t kMaxTransferConnections = 16;

// Products of sizes (parameter counts, activation elements, token offsets): at most 2^53,
// so they are exact in int64 and in double alike.
constexpr int64_t kMaxProduct = int64_t(1) << 53;

}  // namespace weft::core::limits
