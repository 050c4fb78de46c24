// Token sources: llm.c token files (.bin), text files read as bytes, and folders of
// text files (ARCHITECTURE.md, "Weights and data files").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::core::data {

// llm.c's format: 256 little-endian int32 (magic, version, token count, unused), then
// the tokens as little-endian uint16.
constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int64_t kTokenHeaderInts = 256;
constexpr int64_t kTokenHeaderBytes = kTokenHeaderInts * 4;
constexpr int64_t kByteVocab = 256;  // vocabulary of text read as bytes

// Reads the tokens at `path`:
//   - a folder: its regular files sorted by name, concatenated as bytes (symlinks and
//     *.dat files skipped: the fortunes corpus pairs each text with a binary index);
//   - a *.bin file: an llm.c token file;
//   - any other file: its bytes (vocabulary 256).
// Errors (missing path, a FIFO, socket or device, bad magic or version, truncated file,
// empty text) name the path and what was wrong. They are ConfigError(field, ...) when `field` names
// the setting the path came from ("data.path"), IoError otherwise.
std::vector<int32_t> read_token_file(const std::string& path, const std::string& field = {});

// The files read_token_file would concatenate for `path` (one entry for a file).
std::vector<std::string> token_source_files(const std::string& path, const std::string& field = {});

// Writes an llm.c token file (atomically: a temporary file renamed into place).
// Throws IoError when a token is outside [0, 65535] or the file cannot be written.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens);

// Throws ConfigError("model.vocab", ...) naming `field` and `path` when a token is
// >= vocab (or negative): the model could not embed it.
void check_tokens_fit_vocab(const std::vector<int32_t>& tokens, int64_t vocab,
                            const std::string& field, const std::string& path);

}  // namespace weft::core::data
