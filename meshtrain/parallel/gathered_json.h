// Each rank's JSON object joined into one on every rank of a group: for state that ranks hold in
// parts by name (a pipeline stage's optimizer scalars, an expert-parallel rank's experts').
#pragma once

#include <nlohmann/json.hpp>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::parallel {

// Collective over `group` (null: `mine` unchanged). Keys present on several ranks take the value
// of the highest rank holding them.
nlohmann::json merge_json_objects(const comm::ProcessGroupPtr& group, nlohmann::json mine);

}  // namespace meshtrain::parallel
