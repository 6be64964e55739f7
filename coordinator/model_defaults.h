#pragma once

// What a Hugging Face model folder contributes to an experiment before it is
// normalized: its tokenizer, and the sampling defaults of its
// generation_config.json. Reads files; experiment_config.h reads none.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace rlmesh {

// For model.init == checkpoint with model.path `folder` (already resolved
// against the user's directory):
//  - model.tokenizer, when unset, becomes `folder` if it holds a
//    tokenizer.json;
//  - model.max_positions, when unset (0), becomes config.json's
//    max_position_embeddings;
//  - rollout.sampling.temperature, top_p and top_k, when unset (0), take
//    generation_config.json's values where it has them.
// `notes` gets one line per value saying where it came from (the folder, or
// the experiment when both set it). A config.json or generation_config.json
// that is not a JSON object, or whose values are out of range, is
// INVALID_ARGUMENT naming the file and field. Other inits: no change.
absl::Status ApplyModelFolderDefaults(ExperimentConfig* config, const std::string& folder,
                                      std::vector<std::string>* notes);

}  // namespace rlmesh
