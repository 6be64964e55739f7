#pragma once

// Tokenizers: the character-level one of the synthetic tasks and Hugging
// Face's byte-level BPE (tokenizer.json of the GPT-2 / Llama 3 / Qwen2
// family), with the special tokens and stop ids of the model folder the
// tokenizer was read from. No LibTorch here.
//
// Tokenizers are immutable after construction: safe for concurrent use.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh::actor {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`; adds no BOS/EOS (the caller decides).
  virtual std::vector<int> Encode(const std::string& text) const = 0;
  // Text of `ids`; special tokens are written out unless skip_special. Ids
  // outside the vocabulary are skipped.
  virtual std::string Decode(const std::vector<int>& ids, bool skip_special = false) const = 0;
  virtual int vocab_size() const = 0;
  // -1 when the tokenizer has no such token. A BPE tokenizer takes them from
  // tokenizer_config.json beside tokenizer.json (`bos_token`, `eos_token`,
  // `pad_token`), never from the tokens' names.
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int pad_id() const = 0;
  // Ids that end a completion, in order, without repeats:
  // generation_config.json's `eos_token_id` (an int or a list), then
  // eos_id() if it is not among them. Empty when the folder names none.
  virtual std::vector<int> stop_ids() const {
    return eos_id() >= 0 ? std::vector<int>{eos_id()} : std::vector<int>{};
  }
  // Where bos/eos/pad and the stop ids came from, for logs and errors, e.g.
  // "DIR/generation_config.json eos_token_id [7, 9]; DIR/tokenizer_config.json
  // eos_token \"<|im_end|>\"".
  virtual std::string special_tokens_source() const { return "built in"; }
  // The folder the tokenizer was read from; empty when built in. Its
  // tokenizer_config.json, generation_config.json and chat template are
  // copied into the model folders written from this tokenizer.
  virtual std::string source_dir() const { return ""; }
  // Id of an exact token string (special or not); -1 if absent.
  virtual int TokenId(const std::string& token) const = 0;
  // SHA-256 hex of the tokenizer's definition: equal hashes, equal behaviour.
  virtual std::string Hash() const = 0;
  // A Hugging Face tokenizer.json that encodes and decodes as this one does,
  // so PyPI `tokenizers` and transformers' AutoTokenizer open our folders.
  virtual std::string HfTokenizerJson() const = 0;
  // The chat template of the folder it was loaded from (tokenizer_config.json
  // or chat_template.jinja beside tokenizer.json); empty when none.
  virtual std::string chat_template() const { return ""; }
};

// Characters of the synthetic tasks. Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>,
// then digits, lower and upper case letters, space, newline and ASCII
// punctuation/operators. Characters outside map to <unk>.
class CharTokenizer : public Tokenizer {
 public:
  CharTokenizer();
  std::vector<int> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int>& ids, bool skip_special = false) const override;
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  int bos_id() const override { return 1; }
  int eos_id() const override { return 2; }
  int pad_id() const override { return 0; }
  int unk_id() const { return 3; }
  int TokenId(const std::string& token) const override;
  std::string Hash() const override;
  // A BPE with one token per character and no merges, <unk> for anything
  // else, the four specials as added tokens and a Fuse decoder. Same ids for
  // any text that does not spell a special token ("<eos>" is one token
  // there, five characters here).
  std::string HfTokenizerJson() const override;

 private:
  std::vector<std::string> tokens_;
  int char_to_id_[256];
};

// Byte-level BPE from a Hugging Face tokenizer.json: NFC (or no) normalizer;
// ByteLevel, Split(Regex) and Sequence pre-tokenizers; BPE merges (with
// ignore_merges); added and special tokens matched before everything else;
// ByteLevel decoder. Anything else in the file is an INVALID_ARGUMENT that
// names it.
class BpeTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(const std::string& json_text);
  ~BpeTokenizer() override;

  std::vector<int> Encode(const std::string& text) const override;
  std::string Decode(const std::vector<int>& ids, bool skip_special = false) const override;
  int vocab_size() const override { return vocab_size_; }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  int pad_id() const override { return pad_; }
  int TokenId(const std::string& token) const override;
  std::string Hash() const override { return hash_; }
  // The file it was read from, unchanged.
  std::string HfTokenizerJson() const override { return json_; }
  std::string chat_template() const override { return chat_template_; }
  std::vector<int> stop_ids() const override { return stop_ids_; }
  std::string special_tokens_source() const override { return special_source_; }
  std::string source_dir() const override { return source_dir_; }
  // Set by LoadTokenizer from the files beside tokenizer.json.
  void set_chat_template(std::string t) { chat_template_ = std::move(t); }

  struct Impl;

 private:
  BpeTokenizer();
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJsonInternal(const std::string& json_text);
  std::unique_ptr<Impl> impl_;
  int vocab_size_ = 0;
  // Fills the special tokens, stop ids and source folder.
  friend absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec);
  int bos_ = -1, eos_ = -1, pad_ = -1;
  std::vector<int> stop_ids_;
  std::string special_source_ = "none";
  std::string source_dir_;
  std::string hash_;
  std::string json_;
  std::string chat_template_;
};

// "char" -> CharTokenizer, anything else is a tokenizer.json path (or a
// folder holding one). A file that is CharTokenizer's own export (a folder
// we wrote for a char-tokenizer run) gives the CharTokenizer back. A BPE
// tokenizer's special tokens and stop ids come from tokenizer_config.json
// and generation_config.json beside it (both optional); a token named there
// that is not in the vocabulary, or an id outside it, is INVALID_ARGUMENT
// naming the file and field.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec);

// The files that make a model folder open with transformers' AutoTokenizer,
// as (file name, contents): tokenizer.json and tokenizer_config.json. A
// tokenizer read from a folder gives that folder's tokenizer_config.json
// unchanged (and chat_template.jinja and special_tokens_map.json where
// present); otherwise tokenizer_config.json is written: the bos/eos/pad
// tokens by name, `model_max_length`, the chat template if there is one.
std::vector<std::pair<std::string, std::string>> HfTokenizerFiles(const Tokenizer& tokenizer,
                                                                  int64_t model_max_length);

}  // namespace rlmesh::actor
