// Temporary: commands not yet wired (replaced as their modules land).
#include "base/error.h"
#include "launch/commands.h"
namespace weft::launch {
int cmd_train(const std::vector<std::string>&) { throw NotSupported("train: not wired yet"); }
int cmd_data(const std::vector<std::string>&) { throw NotSupported("data: not wired yet"); }
int cmd_bench(const std::vector<std::string>&) { throw NotSupported("bench: not wired yet"); }
}  // namespace weft::launch
