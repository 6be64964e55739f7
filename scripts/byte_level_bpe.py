"""The byte-level BPE tokenizer that scripts/make_hf_model.py and
scripts/make_chat_tokenizer.py train with PyPI `tokenizers`: Qwen2's
pre-tokenizer split (digits one by one), NFC, byte-level pieces. Training is
deterministic for the same texts, vocabulary size and special tokens.

Imported from the scripts' own folder, which Python puts first on sys.path
both from the repository root (python3 scripts/...) and in Bazel runfiles.
"""
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train(texts, vocab_size, special_tokens):
    """A tokenizer trained on `texts` (strings), of at most `vocab_size` ids,
    the `special_tokens` first (ids 0, 1, ...)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    return tok
