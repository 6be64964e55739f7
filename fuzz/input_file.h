#pragma once

// The parsers of datasets and weight files read paths, not buffers: a fuzz
// input is written to one file per process (rewritten each time) and the
// parser is handed its path.

#include <cstddef>
#include <cstdint>
#include <string>

namespace rlmesh::fuzz {

// Writes `data` to this process's input file and returns its path (under
// $TEST_TMPDIR or /tmp; removed at exit). Aborts if it cannot.
std::string WriteInputFile(const uint8_t* data, size_t size, const std::string& suffix);

}  // namespace rlmesh::fuzz
