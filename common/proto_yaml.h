#pragma once

// Loads YAML into a protobuf message by reflection: the proto is the schema.
// Keys are field names; nested maps are messages; sequences are repeated
// fields; enum values may be written by full name (WEIGHT_SYNC_SHM) or by
// the lower-case tail (shm). Every error names the key path and the line:
//   "configs/x.yaml:7: stages[0].grpo.rl.stepz: unknown key (known: steps, ...)"

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace rlmesh {

// Where each key path came from, for errors found after loading (range checks).
class YamlSource {
 public:
  // "file:line: " for a path that was set in YAML, else "file: ".
  std::string Where(const std::string& path) const;
  // Error naming the key path and its line.
  absl::Status Error(const std::string& path, const std::string& message) const;

  std::string file;
  std::map<std::string, int> lines;  // key path -> 1-based line
};

// Parses `yaml_text` into `message` (merged onto what it holds).
absl::Status MergeYaml(const std::string& yaml_text, google::protobuf::Message* message,
                       YamlSource* source);

// Reads and parses a file.
absl::Status LoadYamlFile(const std::string& path, google::protobuf::Message* message,
                          YamlSource* source);

// Applies "a.b[2].c=value" (value parsed as YAML, so lists and maps work).
absl::Status ApplyOverride(const std::string& assignment, google::protobuf::Message* message,
                           YamlSource* source);

}  // namespace rlmesh
