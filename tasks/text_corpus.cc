#include "tasks/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read corpus file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::vector<Document>> ReadJsonl(const std::string& path, const std::string& field) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read corpus file ", path));
  std::vector<Document> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", lineno);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    auto it = j.find(field);
    if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(where, ": missing field '", field, "'"));
    if (!it->is_string()) return absl::InvalidArgumentError(absl::StrCat(where, ": field '", field, "' is not a string"));
    std::string text = it->get<std::string>();
    if (!text.empty()) out.push_back({where, std::move(text)});
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Document>> ReadTextCorpus(const std::string& path, const std::string& text_field) {
  std::error_code ec;
  std::vector<Document> out;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path().string());
    }
    if (ec) return absl::NotFoundError(absl::StrCat("cannot list corpus folder ", path, ": ", ec.message()));
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      auto text = ReadWhole(f);
      if (!text.ok()) return text.status();
      if (!text->empty()) out.push_back({f, *std::move(text)});
    }
  } else if (absl::EndsWith(path, ".jsonl")) {
    auto docs = ReadJsonl(path, text_field);
    if (!docs.ok()) return docs.status();
    out = *std::move(docs);
  } else {
    auto text = ReadWhole(path);
    if (!text.ok()) return text.status();
    if (!text->empty()) out.push_back({path, *std::move(text)});
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no documents"));
  return out;
}

std::vector<PackedRow> PackDocuments(const actor::Tokenizer& tokenizer, const std::vector<std::string>& texts,
                                     int64_t sequence_length) {
  std::vector<PackedRow> rows;
  PackedRow row;
  int64_t used = 0;
  for (const std::string& text : texts) {
    std::vector<int> doc;
    if (tokenizer.bos_id() >= 0) doc.push_back(tokenizer.bos_id());
    for (int id : tokenizer.Encode(text)) doc.push_back(id);
    if (tokenizer.eos_id() >= 0) doc.push_back(tokenizer.eos_id());
    size_t at = 0;
    while (at < doc.size()) {
      const size_t take = std::min<size_t>(doc.size() - at, static_cast<size_t>(sequence_length - used));
      row.pieces.emplace_back(doc.begin() + at, doc.begin() + at + take);
      at += take;
      used += static_cast<int64_t>(take);
      if (used == sequence_length) {
        rows.push_back(std::move(row));
        row = PackedRow();
        used = 0;
      }
    }
  }
  if (used > 0) rows.push_back(std::move(row));
  return rows;
}

}  // namespace rlmesh
