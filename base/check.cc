// Out-of-line failure path of WEFT_CHECK, so the macro stays small at call sites.
#include "base/check.h"

namespace weft::detail {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "check failed: " << cond << " at " << file << ":" << line;
  if (!msg.empty()) os << ": " << msg;
  throw InternalError(os.str());
}

}  // namespace weft::detail
