"""rlmesh's LoRA adapters against PyPI peft, both ways, for a Llama-3.2-style
and a Qwen2.5-style folder (q/k/v biases) written by scripts/make_hf_model.py:

1. ours -> peft: `lora_tool random-adapter` gives the base a random adapter
   (both factors random) and saves the folder (base weights + PEFT's
   adapter_config.json and adapter_model.safetensors); peft opens it with
   PeftModel.from_pretrained on the transformers base, and its logits equal
   ours (`lora_tool logits`) within 1e-5;
2. peft -> ours: peft writes an adapter (random factors, rsLoRA on, a
   subset of targets) with save_pretrained; `lora_tool logits BASE IDS OUT
   ADAPTER` gives peft's logits within 1e-5;
3. `lora_tool merge` writes a plain folder that transformers opens without
   peft, with peft's merge_and_unload logits within 1e-5, and no adapter file.

Usage: lora_peft_test.py ROOT WORKDIR (ROOT: the runfiles tree).
"""
import os
import shutil
import subprocess
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOL = 1e-5
IDS = [5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 18]
failures = []


def check(ok, what):
    print("ok  " if ok else "FAIL", what, flush=True)
    if not ok:
        failures.append(what)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"{cmd[:2]} exited {p.returncode}")


def hf_logits(model):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits.float()


def main():
    root, work = sys.argv[1], sys.argv[2]
    tool = os.path.join(root, "actor", "lora_tool")
    make = os.path.join(root, "scripts", "make_hf_model.py")
    os.makedirs(work, exist_ok=True)
    ids = ",".join(str(i) for i in IDS)

    for arch in ["llama3", "qwen2"]:
        base = os.path.join(work, arch)
        run([sys.executable, make, base, "--arch", arch, "--hidden", "64", "--layers", "2"])

        # 1. Our adapter, opened by peft.
        ours = os.path.join(work, arch + "-ours")
        run([tool, "random-adapter", base, ours, "4", "8", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
             "7"])
        check(os.path.exists(os.path.join(ours, "adapter_config.json")), f"{arch}: adapter_config.json written")
        run([tool, "logits", ours, ids, os.path.join(work, "ours.safetensors")])
        our_logits = load_file(os.path.join(work, "ours.safetensors"))["logits"]
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ours, torch_dtype=torch.float32),
                                               ours)
        ref = hf_logits(peft_model)
        base_only = hf_logits(AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32))
        d = (our_logits - ref).abs().max().item()
        check(d < TOL, f"{arch}: our adapter under peft: max |logit diff| {d:.2e} < {TOL}")
        moved = (ref - base_only).abs().max().item()
        check(moved > 1e-3, f"{arch}: the adapter changes the logits ({moved:.2e})")

        # 2. peft's adapter, read by us.
        model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
        cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True,
                         init_lora_weights=False, task_type="CAUSAL_LM")
        torch.manual_seed(3)
        pm = get_peft_model(model, cfg)
        theirs = os.path.join(work, arch + "-peft")
        pm.save_pretrained(theirs)
        ref2 = hf_logits(pm)
        run([tool, "logits", base, ids, os.path.join(work, "theirs.safetensors"), theirs])
        got = load_file(os.path.join(work, "theirs.safetensors"))["logits"]
        d2 = (got - ref2).abs().max().item()
        check(d2 < TOL, f"{arch}: peft's adapter read by us: max |logit diff| {d2:.2e} < {TOL}")

        # 3. Merged into a plain folder.
        merged = os.path.join(work, arch + "-merged")
        run([tool, "merge", ours, merged])
        check(not os.path.exists(os.path.join(merged, "adapter_config.json")), f"{arch}: merged folder has no adapter")
        ref3 = hf_logits(PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(ours, torch_dtype=torch.float32), ours).merge_and_unload())
        got3 = hf_logits(AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32))
        d3 = (got3 - ref3).abs().max().item()
        check(d3 < TOL, f"{arch}: merged folder under transformers vs peft merge_and_unload: {d3:.2e} < {TOL}")
        shutil.rmtree(base)

    # A bad adapter is refused by name.
    bad = os.path.join(work, "llama3-ours")
    with open(os.path.join(bad, "adapter_config.json")) as f:
        text = f.read()
    with open(os.path.join(bad, "adapter_config.json"), "w") as f:
        f.write(text.replace('"use_dora": false', '"use_dora": true'))
    p = subprocess.run([tool, "logits", bad, ids, os.path.join(work, "bad.safetensors")], capture_output=True,
                       text=True)
    check(p.returncode == 1 and "use_dora" in p.stderr, f"a DoRA adapter is refused by name: {p.stderr.strip()[:200]}")

    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
