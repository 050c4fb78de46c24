// The keys a job YAML file may contain, per section: one table that the parser, the
// --set checks and the tests share.
#pragma once

#include "core/config/yaml_fields.h"

namespace weft::core {

// "" is the top level; "model.moe", "parallel.pipeline", "snapshot.ec" are nested sections.
const YamlSchema& job_spec_schema();

}  // namespace weft::core
