// This machine's name, as gethostname(2) gives it: node ids, error files, root-cause lines
// and checkpoint owner files all name the host the same way.
#pragma once

#include <string>

namespace weft {

// The host name; "unknown-host" when the system call fails (it names nothing then).
std::string host_name();

}  // namespace weft
