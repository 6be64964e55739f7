#pragma once

// Text corpora for continued pre-training, and how they are packed.
//
// A corpus path is a JSONL file (".jsonl": one object per line, the document
// in a string field, default "text"), a folder (each "*.txt" file in it is
// one document, in name order) or any other file (the whole file is one
// document). Empty documents are skipped.
//
// Packing (docs/design/data.md): each document becomes [bos] (when
// the tokenizer has one) + Encode(text) + [eos]; the documents are joined in
// order into one stream and cut into rows of `sequence_length` tokens (the
// last row may be shorter). A row keeps where each document's piece starts:
// the learner gives each piece its own segment, so attention does NOT cross
// document boundaries and positions restart at each piece (the packing of
// SftStage.packing). Every token is trained on except the first of each
// piece, which nothing in its segment predicts.
//
// Plain functions; no state. Errors are INVALID_ARGUMENT naming "path:line"
// and the field.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actor/tokenizer.h"

namespace rlmesh {

struct Document {
  // "path:line" (JSONL) or the file's path.
  std::string source;
  std::string text;
};

absl::StatusOr<std::vector<Document>> ReadTextCorpus(const std::string& path, const std::string& text_field);

// One row of packed tokens: consecutive pieces, each a run of one
// document's tokens.
struct PackedRow {
  std::vector<std::vector<int>> pieces;
  int64_t size() const {
    int64_t n = 0;
    for (const auto& p : pieces) n += static_cast<int64_t>(p.size());
    return n;
  }
};

// REQUIRES: sequence_length >= 1.
std::vector<PackedRow> PackDocuments(const actor::Tokenizer& tokenizer, const std::vector<std::string>& texts,
                                     int64_t sequence_length);

}  // namespace rlmesh
