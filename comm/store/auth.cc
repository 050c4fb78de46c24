// Job tokens and HMAC proofs on OpenSSL's libcrypto (a well-kept, audited implementation:
// Weft does not write its own crypto primitives).
#include "comm/store/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <boost/asio/ip/address.hpp>
#include <fstream>
#include <sstream>

#include "base/env.h"
#include "base/error.h"

namespace weft::comm::auth {

Bytes random_bytes(size_t n) {
  Bytes b(n);
  if (n && RAND_bytes(b.data(), static_cast<int>(n)) != 1)
    throw InternalError("store: RAND_bytes failed to produce " + std::to_string(n) + " bytes");
  return b;
}

std::string generate_token() {
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (uint8_t x : random_bytes(32)) {
    t.push_back(hex[x >> 4]);
    t.push_back(hex[x & 15]);
  }
  return t;
}

Bytes proof(const std::string& token, const Bytes& nonce) {
  return proof(token, nonce, kProofContext);
}

Bytes proof(const std::string& token, const Bytes& message, const std::string& ctx) {
  Bytes msg(message);
  msg.insert(msg.end(), ctx.begin(), ctx.end());
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(), msg.size(),
            out.data(), &len))
    throw InternalError("store: HMAC-SHA256 failed");
  out.resize(len);
  return out;
}

Bytes proof(const std::string& token, const Bytes& first, const Bytes& second,
            const std::string& context) {
  Bytes message(first);
  message.insert(message.end(), second.begin(), second.end());
  return proof(token, message, context);
}

bool proof_matches(const Bytes& expected, const Bytes& got) {
  return expected.size() == got.size() && !expected.empty() &&
         CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

std::string read_token_file(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(field, "cannot read the job token file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) throw ConfigError(field, "the job token file '" + path + "' is empty");
  return t;
}

std::string token_from_env() {
  std::string t = env_string("WEFT_JOB_TOKEN", "");
  if (!t.empty()) return t;
  std::string file = env_string("WEFT_JOB_TOKEN_FILE", "");
  return file.empty() ? std::string() : read_token_file(file, "WEFT_JOB_TOKEN_FILE");
}

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  auto a = boost::asio::ip::make_address(host, ec);
  if (ec) return false;
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return a.to_v6().to_v4().is_loopback();
  return a.is_loopback();
}

}  // namespace weft::comm::auth
