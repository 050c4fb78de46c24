// Job tokens and the store's challenge-response: a client proves it holds the job's token
// without sending it (HMAC-SHA256 of a server nonce, from OpenSSL's libcrypto).
#pragma once

#include <cstddef>
#include <string>

#include "comm/store/store.h"

namespace weft::comm::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // SHA-256
// Mixed into every proof so that an HMAC of the same token made for another purpose can
// never pass as a store login.
constexpr const char* kProofContext = "weft-store-auth-v1";

// `n` bytes from the OS-seeded CSPRNG (RAND_bytes); throws InternalError if it fails.
Bytes random_bytes(size_t n);
// A fresh job token: 32 random bytes as 64 lowercase hex characters.
std::string generate_token();
// HMAC-SHA256(key = token, message = nonce || kProofContext).
Bytes proof(const std::string& token, const Bytes& nonce);
// HMAC-SHA256(key = token, message = message || context): the same proof for another use of
// the job token (the snapshot agents' push connections), whose own context keeps a proof
// made for one use from passing for another.
Bytes proof(const std::string& token, const Bytes& message, const std::string& context);
// The same over `first || second`: a mutual handshake's proof of both sides' nonces, each
// side's in its own order (the snapshot agents' connections, the agents' peer check).
Bytes proof(const std::string& token, const Bytes& first, const Bytes& second,
            const std::string& context);
// Constant-time comparison (CRYPTO_memcmp); false when the lengths differ.
bool proof_matches(const Bytes& expected, const Bytes& got);

// The job token of this process: $WEFT_JOB_TOKEN, else the contents of the file named by
// $WEFT_JOB_TOKEN_FILE, else "". Throws ConfigError naming the variable when the file
// cannot be read or is empty.
std::string token_from_env();
// A token file's contents without trailing whitespace; ConfigError naming `field` when it
// cannot be read or holds nothing.
std::string read_token_file(const std::string& path, const std::string& field);
// True for addresses that only this machine can reach: 127.0.0.0/8, ::1, "localhost".
bool is_loopback(const std::string& host);

}  // namespace weft::comm::auth
