#include "base/host.h"

#include <unistd.h>

#include <charconv>
#include <stdexcept>

namespace weft {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::pair<std::string, uint16_t> split_endpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= endpoint.size())
    throw std::invalid_argument("'" + endpoint + "' is not HOST:PORT");
  unsigned port = 0;
  const char* p = endpoint.data() + colon + 1;
  auto [end, ec] = std::from_chars(p, endpoint.data() + endpoint.size(), port);
  if (ec != std::errc() || end != endpoint.data() + endpoint.size() || port > 65535)
    throw std::invalid_argument("'" + endpoint + "' is not HOST:PORT (the port)");
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, uint16_t(port)};
}

}  // namespace weft
