"""Reference data for actor/ parity tests, produced with PyPI transformers,
tokenizers and safetensors (implementations no one in this project wrote).

  make_golden.py models OUT      tiny random Llama/Qwen2/Qwen3(-MoE)/Qwen2-MoE folders (every RoPE
                                 scaling type)
                                 + logits + greedy tokens
  make_golden.py tokenizers OUT  two trained byte-level BPE tokenizer.json + held-out encodings
  make_golden.py hfload DIR IN   transformers' AutoTokenizer and AutoModelForCausalLM open a
                                 folder we wrote (model + tokenizer files); IN (json) holds
                                 texts with our ids and decodings and a safetensors of our
                                 logits; exits 1 on any difference.
  make_golden.py check DIR IN [DIR IN ...]
                                 load each folder *we* wrote with transformers and compare
                                 its logits with ours (IN: safetensors with input_ids, logits);
                                 exits 1 on any mismatch.
"""
import json
import os
import random
import sys

import torch
from safetensors.torch import load_file, save_file

MODELS = {
    # name: (class, config kwargs)
    "llama_gqa_untied": ("llama", dict(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "llama_mha_tied": ("llama", dict(vocab_size=83, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                                     num_attention_heads=3, num_key_value_heads=3, max_position_embeddings=48,
                                     rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen2_gqa_tied": ("qwen2", dict(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "qwen2_untied": ("qwen2", dict(vocab_size=90, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=40,
                                   rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    # Llama's attention_bias puts a bias on o_proj too.
    "llama_attention_bias": ("llama", dict(vocab_size=71, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                           rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                           attention_bias=True)),
    # Qwen3: QK-norm, head_dim != hidden / heads, attention_bias either way.
    "qwen3_headdim_untied": ("qwen3", dict(vocab_size=89, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=20,
                                           max_position_embeddings=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                           tie_word_embeddings=False, attention_bias=False)),
    "qwen3_bias_tied": ("qwen3", dict(vocab_size=77, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      max_position_embeddings=48, rope_theta=10000.0, rms_norm_eps=1e-6,
                                      tie_word_embeddings=True, attention_bias=True)),
    # RoPE scaling: logits at lengths beyond the original context (SEQ below).
    "llama_rope_linear": ("llama", dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama_rope_dynamic": ("llama", dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                         rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))),
    "llama_rope_llama3": ("llama", dict(vocab_size=61, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                             low_freq_factor=1.0, high_freq_factor=4.0,
                                                             original_max_position_embeddings=16))),
    "qwen3_rope_yarn": ("qwen3", dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                      max_position_embeddings=64,
                                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                           original_max_position_embeddings=16))),
    "llama_rope_yarn_mscale": ("llama", dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=60,
                                             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=3.0,
                                                                  original_max_position_embeddings=20, beta_fast=16.0,
                                                                  beta_slow=2.0, mscale=0.8, mscale_all_dim=0.5,
                                                                  truncate=False))),
    # Qwen3-MoE: top-k routing with and without renormalisation, dense layers
    # by mlp_only_layers and decoder_sparse_step.
    "qwen3_moe_norm": ("qwen3_moe", dict(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                         max_position_embeddings=64, moe_intermediate_size=16, num_experts=6,
                                         num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                                         decoder_sparse_step=1, tie_word_embeddings=False)),
    "qwen3_moe_sparse_step": ("qwen3_moe", dict(vocab_size=59, hidden_size=24, intermediate_size=40,
                                                num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                                max_position_embeddings=48, moe_intermediate_size=12, num_experts=5,
                                                num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
                                                tie_word_embeddings=True)),
    # Qwen2-MoE: q/k/v bias (qkv_bias) and a shared expert behind a sigmoid
    # gate next to the routed ones.
    "qwen2_moe_shared": ("qwen2_moe", dict(vocab_size=73, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                           moe_intermediate_size=16, shared_expert_intermediate_size=24,
                                           num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
                                           mlp_only_layers=[0], decoder_sparse_step=1, tie_word_embeddings=False)),
    "qwen2_moe_nobias_norm": ("qwen2_moe", dict(vocab_size=61, hidden_size=24, intermediate_size=40,
                                                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                max_position_embeddings=48, moe_intermediate_size=12,
                                                shared_expert_intermediate_size=20, num_experts=5,
                                                num_experts_per_tok=3, norm_topk_prob=True, qkv_bias=False,
                                                tie_word_embeddings=True)),
}

# Sequence length of the golden logits (default 17): past the original
# context (and past max_position_embeddings for dynamic, where it starts).
SEQ = {"llama_rope_linear": 60, "llama_rope_dynamic": 50, "llama_rope_llama3": 60, "qwen3_rope_yarn": 60,
       "llama_rope_yarn_mscale": 60}


def build(kind, kw):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw))
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**kw))
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**kw))
    if kind == "qwen2_moe":
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
        return Qwen2MoeForCausalLM(Qwen2MoeConfig(**kw))
    return Qwen2ForCausalLM(Qwen2Config(**kw))


def randomize(model, seed):
    # transformers' init (std 0.02) makes near-uniform logits; larger random
    # weights make the comparison meaningful.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))


def models(out):
    torch.manual_seed(0)
    summary = {}
    for i, (name, (kind, kw)) in enumerate(MODELS.items()):
        model = build(kind, kw).eval()
        randomize(model, 100 + i)
        d = os.path.join(out, name)
        model.save_pretrained(d)
        g = torch.Generator().manual_seed(7 + i)
        seq = SEQ.get(name, 17)
        ids = torch.randint(0, kw["vocab_size"], (3, seq), generator=g)
        pos = torch.arange(seq).unsqueeze(0).expand(3, seq).contiguous()
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=pos).logits.float()
        tensors = {"input_ids": ids, "logits": logits.contiguous()}
        if kind in ("qwen3_moe", "qwen2_moe"):
            # The router's load-balancing loss (unscaled), over these tokens.
            with torch.no_grad():
                res = model(input_ids=ids, position_ids=pos, output_router_logits=True)
            tensors["aux_loss"] = res.aux_loss.float().reshape(1)
        save_file(tensors, os.path.join(d, "golden_logits.safetensors"))
        prompts = [torch.randint(0, kw["vocab_size"], (n,), generator=g).tolist() for n in (1, 5, 11)]
        greedy = []
        for p in prompts:
            with torch.no_grad():
                o = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                   do_sample=False, max_new_tokens=12, min_new_tokens=12,
                                   eos_token_id=None, pad_token_id=0)
            greedy.append(o[0, len(p):].tolist())
        with open(os.path.join(d, "golden_greedy.json"), "w") as f:
            json.dump({"prompts": prompts, "greedy": greedy, "max_new_tokens": 12}, f)
        summary[name] = kind
    print("models:", summary)


def corpus(seed, n):
    rnd = random.Random(seed)
    words = ["the", "model", "learns", "don't", "I'LL", "we've", "it's", "rollout", "reward", "GRPO", "Ünïcödé",
             "naïve", "café", "straße", "日本語", "文字列", "Привет", "мир", "αβγ", "λόγος", "مرحبا", "שלום",
             "🙂", "🚀🚀", "👩‍💻", "🇫🇷", "x²", "½", "٣", "١٢٣", "Ⅻ", "—", "«quote»", "’s", "'re"]
    code = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
            "if x != None and y >= 3:", "{\"key\": [1, 2, 3], \"v\": null}", "SELECT * FROM t WHERE id=42;",
            "#include <vector>\r\n", "a->b = c::d<e>();"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "    \n", "\x0b",
              "\u0085", "\x0c"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rnd.randint(1, 14)):
            r = rnd.random()
            if r < 0.45:
                parts.append(rnd.choice(words))
            elif r < 0.6:
                parts.append(str(rnd.randint(0, 10 ** rnd.randint(1, 9))))
            elif r < 0.7:
                parts.append(rnd.choice(code))
            elif r < 0.8:
                parts.append(rnd.choice("+-*/=()[]{}<>.,;:!?'\"#$%&@^_|~`"))
            else:
                parts.append(rnd.choice(spaces))
            parts.append(rnd.choice([" ", " ", "", rnd.choice(spaces)]))
        out.append("".join(parts))
    return out


QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizers_(out):
    from tokenizers import Regex, Tokenizer, decoders, models as tmodels, normalizers, pre_tokenizers, trainers
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    train = corpus(1, 3000)
    heldout = corpus(2, 300) + [
        "", " ", "   leading", "trailing   ", "a\n\n\nb", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "x<|endoftext|>y", "tab\tsep\tvalues", "emoji 👨‍👩‍👧‍👦 family", "unseen: ĳ ǅ ﬁ ẞ 𝔘𝔫𝔦", "12345678901234567890",
        "e\u0301 vs \u00e9", "ＡＢＣ full width", "\x00\x01 control",
    ]
    specs = {
        "gpt2": lambda t: (setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=False)),),
        "qwen2": lambda t: (setattr(t, "normalizer", normalizers.NFC()),
                            setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([
                                pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))),
        "llama3": lambda t: (setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([
                                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),),
    }
    result = {}
    for name, setup in specs.items():
        tok = Tokenizer(tmodels.BPE(ignore_merges=(name == "llama3")))
        setup(tok)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(train, trainer)
        path = os.path.join(out, f"{name}_tokenizer.json")
        tok.save(path)
        enc = [tok.encode(t, add_special_tokens=False).ids for t in heldout]
        dec = [tok.decode(e, skip_special_tokens=False) for e in enc]
        # Random id sequences, as an untrained policy samples them: pieces
        # of multi-byte characters decode to U+FFFD as tokenizers does it.
        rnd = random.Random(3)
        rand_ids = [[rnd.randrange(tok.get_vocab_size()) for _ in range(rnd.randint(1, 12))] for _ in range(400)]
        rand_dec = [tok.decode(e, skip_special_tokens=True) for e in rand_ids]
        with open(os.path.join(out, f"{name}_heldout.json"), "w") as f:
            json.dump({"texts": heldout, "ids": enc, "decoded": dec, "vocab_size": tok.get_vocab_size(),
                       "random_ids": rand_ids, "random_decoded": rand_dec}, f)
        result[name] = tok.get_vocab_size()
    print("tokenizers:", result)


def check(pairs):
    """Each (folder, ours) pair: transformers loads the folder and must give
    the logits in ours. One process for all pairs (importing is the cost)."""
    from transformers import AutoModelForCausalLM
    bad = 0
    for folder, ours_path in pairs:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        data = load_file(ours_path)
        ids = data["input_ids"]
        pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids).contiguous()
        with torch.no_grad():
            ref = model(input_ids=ids, position_ids=pos).logits.float()
        diff = (ref - data["logits"]).abs().max().item()
        print(f"check {folder}: max |logit diff| = {diff:.3g}")
        bad += diff > 1e-4
    sys.exit(1 if bad else 0)


def hfload(folder, ours_json):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    with open(ours_json) as f:
        ours = json.load(f)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gen = GenerationConfig.from_pretrained(folder)
    bad = []
    for text, ids, decoded in zip(ours["texts"], ours["ids"], ours["decoded"]):
        got = tok.encode(text, add_special_tokens=False)
        if got != ids:
            bad.append(f"ids of {text!r}: transformers {got}, ours {ids}")
        back = tok.decode(ids, skip_special_tokens=True)
        if back != decoded:
            bad.append(f"decode of {text!r}: transformers {back!r}, ours {decoded!r}")
    if tok.chat_template != ours["chat_template"]:
        bad.append(f"chat_template: transformers {tok.chat_template!r}, ours {ours['chat_template']!r}")
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(tok, key) != ours[key] or getattr(gen, key) != ours[key]:
            bad.append(f"{key}: tokenizer {getattr(tok, key)}, generation_config {getattr(gen, key)}, ours {ours[key]}")
    data = load_file(ours["logits"])
    ids = data["input_ids"]
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids).contiguous()
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos).logits.float()
    diff = (ref - data["logits"]).abs().max().item()
    if diff > 1e-4:
        bad.append(f"max |logit diff| = {diff:.3g}")
    print(f"hfload {folder}: {len(ours['texts'])} texts, max |logit diff| = {diff:.3g}")
    for b in bad:
        print("MISMATCH", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    cmd, out = sys.argv[1], sys.argv[2]
    if cmd == "check":
        args = sys.argv[2:]
        check(list(zip(args[0::2], args[1::2])))
    if cmd == "hfload":
        hfload(out, sys.argv[3])
    os.makedirs(out, exist_ok=True)
    if cmd == "models":
        models(out)
    elif cmd == "tokenizers":
        tokenizers_(out)
    else:
        sys.exit(f"unknown command {cmd}")
