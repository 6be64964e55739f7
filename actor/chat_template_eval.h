#pragma once

// Internal to :chat_template. Walks a parsed template over a context and
// writes the text. One call is one render; nothing outlives it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actor/chat_template_ast.h"
#include "actor/chat_template_builtins.h"
#include "actor/chat_template_value.h"

namespace rlmesh::actor::chat_template_internal {

struct RenderSettings {
  BuiltinEnv builtins;
  int64_t max_output_bytes = 0;     // also bounds any string or list built
  int64_t max_loop_iterations = 0;  // all loops of the render together
};

// `context` holds the template's variables (messages, tools, ...).
absl::StatusOr<std::string> RenderProgram(const std::vector<StmtPtr>& program,
                                          const ValueDict& context,
                                          const RenderSettings& settings);

}  // namespace rlmesh::actor::chat_template_internal
