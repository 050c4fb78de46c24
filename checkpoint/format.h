// The on-disk form of a durable checkpoint (docs/checkpoint-format.md): a folder per step
// holding metadata.json and one file per shard. This header is the metadata's schema and
// its JSON reader and writer; checkpoint.h writes and reads the folders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace weft::checkpoint {

// Version 2 added job_id and metadata_crc32c (a checksum of the metadata itself); version 1
// folders are refused with a message saying so.
inline constexpr const char* kFormat = "weft-checkpoint/2";
inline constexpr const char* kMetadataFile = "metadata.json";
// Shards are checksummed per block of this many bytes (plus once whole), so a load that
// reads a few rows verifies what it read without reading the whole shard.
inline constexpr int64_t kBlockBytes = int64_t(1) << 20;

struct StateRecord {
  std::string name, kind;  // kind: parameter | adam_m | adam_v | master | buffer
  core::DType dtype = core::DType::kF32;
  core::Shape shape;  // global
};

// One plain box of a state stored row-major at [offset, offset + bytes) of its shard file.
struct BoxRecord {
  int state = -1;  // index into Metadata::states
  std::vector<int64_t> start, extent;
  int64_t offset = 0, bytes = 0;
};

struct ShardRecord {
  std::string file;  // relative to the step folder
  int rank = -1;     // the writer's rank in the layout it was saved under
  int64_t bytes = 0;
  uint32_t crc32c = 0;                 // of the whole file
  std::vector<uint32_t> block_crc32c;  // of each kBlockBytes block (the last may be short)
  std::vector<BoxRecord> boxes;
};

struct Metadata {
  std::string format = kFormat;
  std::string job_id;         // 16 hex digits, chosen once per job (checkpoint/job_id.h)
  uint64_t model_hash = 0;    // core::model_config_hash of the model section
  std::string model;          // human-readable: "gpt, 2 layers, dim 64, ..."
  std::string job_yaml;       // the job spec it was trained with (export rebuilds the model)
  int64_t step = 0;           // optimizer steps done; the next step to run
  uint64_t seed = 0;          // train.seed: parameter init and data order derive from it
  int64_t global_batch = 0;   // with step, the data cursor:
  int64_t data_sequence = 0;  //   global sequences consumed = step * global_batch
  std::string layout;         // what wrote it ("single process", "plan dp2 tp2 ...")
  int64_t block_bytes = kBlockBytes;
  std::vector<StateRecord> states;
  std::vector<ShardRecord> shards;

  int find_state(const std::string& name) const;  // -1 when absent
};

// The JSON text, ending with "metadata_crc32c": the crc32c of metadata_canonical_json(m),
// which is exactly this text without that member.
std::string metadata_to_json(const Metadata& m);
// The canonical form the metadata checksum covers: every field, no metadata_crc32c.
std::string metadata_canonical_json(const Metadata& m);
// Throws IoError("<source>: ...") for malformed or incomplete metadata, another format, or
// a metadata_crc32c that does not match the canonical form of what was read (an edit).
Metadata metadata_from_json(const std::string& text, const std::string& source);

}  // namespace weft::checkpoint
