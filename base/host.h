// This machine's name, as gethostname(2) gives it: node ids, error files, root-cause lines
// and checkpoint owner files all name the host the same way. And the one reading of a
// "host:port" endpoint that the agents' connections share.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace weft {

// The host name; "unknown-host" when the system call fails (it names nothing then).
std::string host_name();

// "host:port" (or "[v6 address]:port") -> (host without brackets, port);
// std::invalid_argument naming the text when it is not one.
std::pair<std::string, uint16_t> split_endpoint(const std::string& endpoint);

}  // namespace weft
