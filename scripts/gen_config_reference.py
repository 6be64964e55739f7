#!/usr/bin/env python3
"""Writes docs/configuration.md, the config reference, from proto/config.proto.

    python3 scripts/gen_config_reference.py                  # (re)write docs/configuration.md
    python3 scripts/gen_config_reference.py --check docs/configuration.md

The schema is compiled with grpc_tools.protoc (PyPI grpcio-tools) into a
FileDescriptorSet with source info, so every field's doc comment comes from
the .proto itself. The reference covers ExperimentConfig and every message
reachable from it, then ClusterConfig (the `coordinator launch` YAML) and
what it reaches, one section per message in that breadth-first order. A
field's default and range are read from its comment ("Default X", "in [a, b]",
"must be >= 0", ...); where the comment gives none the cell says "—".

--check exits 1, printing the lines that differ and the command that
regenerates the file, when FILE is not what this script would write; 0 when
it is. //docs:config_reference_test runs it.
"""
import argparse
import difflib
import os
import re
import sys
import tempfile

ROOTS = ("rlmesh.ExperimentConfig", "rlmesh.ClusterConfig")
OUTPUT = "docs/configuration.md"
REGENERATE = "python3 scripts/gen_config_reference.py"
NONE = "—"

# A short YAML example per top-level message (keyed by message name), as
# (key path, value) pairs. Every path is checked against the schema, so an
# example that names a renamed or removed field stops the generator.
EXAMPLES = {
    "ExperimentConfig": [
        ("name", "my_arith"),
        ("seed", "1234"),
        ("model", "{init: scratch, arch: llama, hidden: 128, layers: 3, heads: 4, kv_heads: 2, max_positions: 32}"),
        ("task", '{kind: arithmetic, digits: 2, ops: "+"}'),
        ("stages[0].sft", "{steps: 1000, batch: 64, optimizer: {lr: 1.0e-3}}"),
        ("stages[1].grpo", "{rl: {steps: 200, prompts_per_step: 64, samples_per_prompt: 8, optimizer: {lr: 3.0e-4}}}"),
        ("rollout", "{workers: 2, sampling: {temperature: 1.0, max_new_tokens: 5}}"),
        ("reward", "{verifiers: [{name: numeric_answer}]}"),
    ],
    "ModelConfig": [
        ("model.init", "checkpoint"),
        ("model.path", "/models/Qwen2.5-0.5B-Instruct"),
        ("model.tokenizer", "/models/Qwen2.5-0.5B-Instruct/tokenizer.json"),
        ("model.dtype", "bf16"),
        ("model.device", "cuda"),
    ],
    "TaskConfig": [
        ("task.kind", "jsonl"),
        ("task.train_path", "configs/data/word_problems_train.jsonl"),
        ("task.eval_path", "configs/data/word_problems_eval.jsonl"),
        ("task.prompt_field", "question"),
        ("task.answer_field", "answer"),
    ],
    "Stage": [
        ("stages[0].sft.steps", "400"),
        ("stages[0].sft.batch", "64"),
        ("stages[0].sft.optimizer.lr", "1.0e-3"),
        ("stages[1].grpo.advantage", "grpo"),
        ("stages[1].grpo.rl.steps", "200"),
        ("stages[1].grpo.rl.prompts_per_step", "64"),
        ("stages[1].grpo.rl.samples_per_prompt", "8"),
        ("stages[1].grpo.rl.optimizer.lr", "3.0e-4"),
        ("stages[1].grpo.rl.clip_high", "0.28"),
        ("stages[1].grpo.rl.kl.coef", "0.0"),
    ],
    "RolloutConfig": [
        ("rollout.workers", "2"),
        ("rollout.sampling.temperature", "1.0"),
        ("rollout.sampling.max_new_tokens", "256"),
        ("rollout.max_batch", "64"),
        ("rollout.on_update", "finish"),
    ],
    "RewardConfig": [
        ("reward.verifiers", "[{name: numeric_answer, weight: 1.0}, {name: command, command: [examples/rewards/contains_answer.py], weight: 0.5}]"),
        ("reward.verifier_timeout_ms", "1000"),
        ("reward.call.on_failure", "retry"),
    ],
    "BufferConfig": [
        ("buffer.sample_mode", "fifo"),
        ("buffer.keep_steps", "50"),
    ],
    "LearnerConfig": [
        ("learner.shards", "2"),
        ("learner.zero", "1"),
        ("learner.micro_batch_tokens", "8192"),
        ("learner.gradient_checkpointing", "false"),
    ],
    "WeightSyncConfig": [
        ("weight_sync.backend", "shm"),
        ("weight_sync.bucket_mb", "64"),
    ],
    "CheckpointConfig": [
        ("checkpoint.every", "50"),
        ("checkpoint.keep", "2"),
    ],
    "EvalConfig": [
        ("eval.every", "25"),
        ("eval.prompts", "300"),
        ("eval.pass_at", "[1, 4]"),
    ],
    "LoggingConfig": [
        ("logging.tensorboard", "true"),
        ("logging.prometheus_port", "0"),
    ],
    "EnvironmentConfig": [
        ("environment.launch", "true"),
        ("environment.name", "calculator"),
        ("environment.max_turns", "4"),
        ("environment.stop_markers", '["</calc>"]'),
    ],
    "ClusterConfig": [
        ("name", "local"),
        ("coordinator_port", "7401"),
        ("rollout_workers", "2"),
        ("reward_servers", "1"),
        ("learners", "2"),
    ],
}

SCALAR_TYPES = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64",
    7: "fixed32", 8: "bool", 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32",
    16: "sfixed64", 17: "sint32", 18: "sint64",
}
TYPE_MESSAGE, TYPE_ENUM, TYPE_BOOL, TYPE_STRING = 11, 14, 8, 9
LABEL_REPEATED = 3


def compile_descriptors(root):
    """FileDescriptorSet of proto/config.proto and its imports, with comments."""
    try:
        from grpc_tools import protoc
        import grpc_tools
    except ImportError:
        sys.exit("gen_config_reference: needs the grpcio-tools package (scripts/setup.sh installs it)")
    from google.protobuf import descriptor_pb2

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "config.desc")
        rc = protoc.main([
            "protoc", "-I" + root, "-I" + include, "--include_source_info", "--include_imports",
            "--descriptor_set_out=" + out, os.path.join(root, "proto", "config.proto"),
        ])
        if rc != 0:
            sys.exit("gen_config_reference: protoc failed on proto/config.proto")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    return fds


def clean_comment(text):
    lines = [line.strip() for line in (text or "").strip().splitlines()]
    return re.sub(r"\s+", " ", " ".join(line for line in lines if line)).strip()


class Schema:
    """Messages and enums by full name, each field with its comment and line."""

    def __init__(self, fds):
        self.messages = {}  # full name -> (DescriptorProto, comment, [field info])
        self.enums = {}  # full name -> [value names]
        for f in fds.file:
            locs = {tuple(l.path): l for l in f.source_code_info.location}
            prefix = f.package
            for i, m in enumerate(f.message_type):
                self._add_message(m, prefix, (4, i), locs)
            for e in f.enum_type:
                self.enums[(prefix + "." if prefix else "") + e.name] = [v.name for v in e.value]

    def _add_message(self, m, prefix, path, locs):
        name = (prefix + "." if prefix else "") + m.name
        loc = locs.get(path)
        fields = []
        for j, fd in enumerate(m.field):
            floc = locs.get(path + (2, j))
            fields.append({
                "fd": fd,
                "comment": clean_comment(floc.leading_comments) if floc else "",
                "line": floc.span[0] if floc else -1,
            })
        self.messages[name] = (m, clean_comment(loc.leading_comments) if loc else "", fields)
        for j, nested in enumerate(m.nested_type):
            if nested.options.map_entry:
                continue
            self._add_message(nested, name, path + (3, j), locs)
        for e in m.enum_type:
            self.enums[name + "." + e.name] = [v.name for v in e.value]


def short(full_name):
    return full_name.rsplit(".", 1)[-1]


def anchor(full_name):
    return short(full_name).lower()


def enum_values(names):
    """YAML spellings: the loader takes a value's suffix after a '_' in any case."""
    if len(names) < 2:
        return [n.lower() for n in names]
    prefix = os.path.commonprefix(names)
    prefix = prefix[: prefix.rfind("_") + 1] if "_" in prefix else ""
    return [n[len(prefix):].lower() for n in names]


def split_value(text):
    """The value after "Default": up to a ';' or a sentence-ending '.' outside brackets."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth <= 0 and ch == ";":
            return text[:i].strip()
        elif depth <= 0 and ch == "." and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i].strip()
        elif depth <= 0 and text.startswith(", so ", i):
            return text[:i].strip()
    return text.strip()


def parse_default(comment, position, group_size):
    # "Default X" opening a sentence wins over a "default X" inside one.
    m = (re.search(r"(?:^|[.;]\s+)(Defaults?)\b:?\s*(.*)", comment)
         or re.search(r"(?:[;(]\s*)([Dd]efaults?)\b:?\s*(.*)", comment))
    if m:
        value = split_value(m.group(2))
        value = re.sub(r"^=\s*", "", value)
        if group_size > 1 and m.group(1) == "Defaults":
            parts = [p.strip() for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", value) if p.strip()]
            if len(parts) == group_size:
                return parts[position]
        if value:
            return value
    m = re.search(r"\bthe default (\d[\w.+-]*?)\.?(?:\s|$|\))", comment)
    if m:
        return m.group(1)
    m = re.search(r"(?:^|[\s(;])0 = (.*)", comment)
    if m:
        return "0: " + split_value(m.group(1).rstrip(")"))
    m = re.search(r"(?:^|[\s(;])0 ((?:keeps|picks|disables)\b.*)", comment)
    if m:
        return "0: " + split_value(m.group(1).rstrip(")"))
    m = re.search(r"(?:^|[\s(;.])[Ee]mpty (?:= |means )?(.*)", comment)
    if m:
        return '"": ' + split_value(m.group(1).rstrip(")"))
    return None


def parse_range(comment, field_name):
    parts = []
    m = re.search(r"\b[Ii]n ([\[(][^\])]*[\])])", comment)
    if m:
        parts.append(m.group(1))
    m = re.search(r"(\d+(?:\.\d+)?) <= ([\w <=]+?) <= (\d+(?:\.\d+)?)", comment)
    if m and field_name in m.group(2).split(" <= "):
        parts.append("[%s, %s]" % (m.group(1), m.group(3)))
    for m in re.finditer(r"(?:[Mm]ust be\s+|[;(]\s*)(>=|>|<=|<)\s*(-?[\d.]*\d)", comment):
        parts.append(m.group(1) + " " + m.group(2))
    m = re.search(r"[Mm]ust divide ([\w.]+)", comment)
    if m:
        parts.append("divides " + m.group(1).rstrip("."))
    seen = []
    for p in parts:
        if p not in seen:
            seen.append(p)
    return "; ".join(seen) if seen else None


def cell(text):
    return text.replace("|", "\\|")


def code(text):
    return "`" + text + "`"


class Reference:
    def __init__(self, schema):
        self.schema = schema
        self.order = []  # message full names, breadth first
        self.paths = {}  # message full name -> [YAML key paths where it appears]

    def walk(self):
        for root in ROOTS:
            if root not in self.schema.messages:
                sys.exit("gen_config_reference: %s is not in proto/config.proto" % root)
            self._walk_from(root)

    def _walk_from(self, root):
        queue = [(root, "")]
        while queue:
            name, path = queue.pop(0)
            if name in self.paths:
                if path not in self.paths[name]:
                    self.paths[name].append(path)
                continue
            self.paths[name] = [path]
            self.order.append(name)
            _, _, fields = self.schema.messages[name]
            for f in fields:
                fd = f["fd"]
                if fd.type == TYPE_MESSAGE:
                    key = (path + "." if path else "") + fd.name + ("[]" if fd.label == LABEL_REPEATED else "")
                    queue.append((fd.type_name.lstrip("."), key))
        # A message reached from several places is listed once, at the path
        # found first; the later paths are listed under its heading.

    def type_of(self, fd, oneof):
        if fd.type == TYPE_MESSAGE:
            t = "[%s](#%s)" % (short(fd.type_name), anchor(fd.type_name))
        elif fd.type == TYPE_ENUM:
            t = "enum " + short(fd.type_name)
        else:
            t = SCALAR_TYPES.get(fd.type, "?")
        if fd.label == LABEL_REPEATED:
            return "repeated " + t
        if fd.proto3_optional:
            return "optional " + t
        if oneof:
            return t + " (oneof " + oneof + ")"
        return t

    def field_rows(self, name):
        m, _, fields = self.schema.messages[name]
        prefix = self.paths[name][0]
        rows = []
        # Fields on consecutive lines with one comment above the first share
        # it ("Defaults 7402, 7403, 7404, 7405." gives each its own).
        groups = []
        for f in fields:
            if (not f["comment"] and groups and groups[-1][-1]["line"] == f["line"] - 1
                    and groups[-1][0]["comment"]
                    and groups[-1][-1]["fd"].HasField("oneof_index") == f["fd"].HasField("oneof_index")):
                groups[-1].append(f)
            else:
                groups.append([f])
        for group in groups:
            comment = group[0]["comment"]
            for pos, f in enumerate(group):
                fd = f["fd"]
                oneof = None
                if fd.HasField("oneof_index") and not fd.proto3_optional:
                    oneof = m.oneof_decl[fd.oneof_index].name
                key = (prefix + "." if prefix else "") + fd.name
                if fd.label == LABEL_REPEATED and fd.type == TYPE_MESSAGE:
                    key += "[]"
                text = comment
                if not text and fd.type == TYPE_MESSAGE:
                    text = self.schema.messages[fd.type_name.lstrip(".")][1]
                if fd.type == TYPE_BOOL and fd.label != LABEL_REPEATED:
                    default = "false"
                elif fd.type == TYPE_MESSAGE or fd.label == LABEL_REPEATED:
                    default = NONE
                elif fd.type == TYPE_ENUM:
                    default = enum_values(self.schema.enums[fd.type_name.lstrip(".")])[0]
                else:
                    default = parse_default(comment, pos, len(group)) or NONE
                if fd.type == TYPE_ENUM:
                    allowed = "one of " + ", ".join(enum_values(self.schema.enums[fd.type_name.lstrip(".")]))
                else:
                    allowed = parse_range(comment, fd.name) or NONE
                rows.append("| %s | %s | %s | %s | %s |" % (
                    code(key), self.type_of(fd, oneof), cell(default), cell(allowed), cell(text or NONE)))
        return rows

    def check_example(self, name, key_path):
        """Fails the generator when an example names a field the schema lacks."""
        msg = "rlmesh." + name if name == "ClusterConfig" else "rlmesh.ExperimentConfig"
        for part in key_path.split("."):
            field = re.sub(r"\[\d*\]$", "", part)
            if msg is None:
                sys.exit("gen_config_reference: the example of %s names %s, past a scalar field" % (name, key_path))
            fds = {f["fd"].name: f["fd"] for f in self.schema.messages[msg][2]}
            if field not in fds:
                sys.exit("gen_config_reference: the example of %s names %s, but %s has no field %s"
                         % (name, key_path, short(msg), field))
            fd = fds[field]
            msg = fd.type_name.lstrip(".") if fd.type == TYPE_MESSAGE else None

    def example(self, name):
        pairs = EXAMPLES.get(name)
        if not pairs:
            return []
        for key, _ in pairs:
            self.check_example(name, key)
        return ["Example:", "", "```yaml"] + yaml_lines(pairs) + ["```", ""]

    def render(self):
        self.walk()
        out = [
            "# Configuration reference",
            "",
            "<!-- Generated from proto/config.proto by scripts/gen_config_reference.py; do not edit by hand. -->",
            "",
            "This page is generated from the doc comments of `proto/config.proto`, the schema",
            "that experiment and cluster YAML files load into. To change it, edit the",
            "comments there and run `%s`; `bazel test //docs:config_reference_test`" % REGENERATE,
            "fails while this page is out of date.",
            "",
            "How a YAML file maps onto these tables:",
            "",
            "- An experiment config is an `ExperimentConfig`; a cluster file for",
            "  `coordinator launch --cluster` is a `ClusterConfig`. Keys are the field names.",
            "- An unknown key, a wrong type or an out-of-range value is an error naming the",
            "  key path and the line.",
            "- `--set key.path=value` on `coordinator run` or `coordinator submit` overrides one",
            "  field, with the key paths of the first column (`--set stages[1].grpo.rl.steps=20`;",
            "  `[]` in a key stands for a list index).",
            "- A zero value (0, \"\", an absent key) means the default the comment names.",
            "- An enum takes its value's name in lower case without the common prefix",
            "  (`backend: shm` for `WEIGHT_SYNC_SHM`).",
            "- Default and Range are read from the comments; \"%s\" means the comment names none." % NONE,
            "",
            "## Messages",
            "",
        ]
        for name in self.order:
            out.append("- [%s](#%s)" % (short(name), anchor(name)))
        out.append("")
        for name in self.order:
            _, comment, _ = self.schema.messages[name]
            out.append("## " + short(name))
            out.append("")
            if comment:
                out.append(comment)
                out.append("")
            paths = self.paths[name]
            if paths == [""]:
                what = "an experiment YAML" if name == "rlmesh.ExperimentConfig" else "a cluster YAML"
                out.append("The top level of %s." % what)
            else:
                out.append("Key path%s: %s." % ("s" if len(paths) > 1 else "", ", ".join(code(p) for p in paths)))
            out.append("")
            out.extend(self.example(short(name)))
            out.append("| Key | Type | Default | Range | Description |")
            out.append("| --- | --- | --- | --- | --- |")
            out.extend(self.field_rows(name))
            out.append("")
        return "\n".join(out)


def yaml_lines(pairs):
    """Nested block YAML from dotted key paths ("stages[1].grpo.rl.steps")."""
    tree = {}
    for key, value in pairs:
        node = tree
        parts = key.split(".")
        for i, part in enumerate(parts):
            m = re.match(r"^(\w+)\[(\d+)\]$", part)
            last = i == len(parts) - 1
            if m:
                lst = node.setdefault(m.group(1), [])
                idx = int(m.group(2))
                while len(lst) <= idx:
                    lst.append({})
                if last:
                    lst[idx] = value
                node = lst[idx]
            elif last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
    lines = []

    def emit(node, indent, first_prefix=None):
        pad = " " * indent
        for n, (k, v) in enumerate(node.items()):
            lead = first_prefix if (first_prefix is not None and n == 0) else pad
            if isinstance(v, dict):
                lines.append("%s%s:" % (lead, k))
                emit(v, indent + 2)
            elif isinstance(v, list):
                lines.append("%s%s:" % (lead, k))
                for item in v:
                    if isinstance(item, dict):
                        emit(item, indent + 4, pad + "  - ")
                    else:
                        lines.append("%s  - %s" % (pad, item))
            else:
                lines.append("%s%s: %s" % (lead, k, v))

    emit(tree, 0)
    return lines


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated reference")
    parser.add_argument("--out", metavar="FILE", help="where to write (default: <root>/%s)" % OUTPUT)
    parser.add_argument("--root", default=os.path.dirname(here),
                        help="repository root holding proto/config.proto (default: this script's parent folder)")
    args = parser.parse_args()

    text = Reference(Schema(compile_descriptors(args.root))).render()
    if not text.endswith("\n"):
        text += "\n"
    if args.check:
        try:
            with open(args.check, encoding="utf-8") as f:
                current = f.read()
        except OSError as e:
            print("%s: cannot read it (%s). Generate it with: %s" % (args.check, e.strerror, REGENERATE))
            return 1
        if current == text:
            return 0
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                         fromfile=OUTPUT + " (checked in)", tofile=OUTPUT + " (from proto/config.proto)",
                                         lineterm="", n=1))
        shown = diff[:60]
        print("%s is out of date with proto/config.proto; %d line(s) differ:" % (
            OUTPUT, sum(1 for l in diff if l[:1] in "+-" and l[:3] not in ("+++", "---"))))
        print("\n".join(shown))
        if len(diff) > len(shown):
            print("... (%d more diff lines)" % (len(diff) - len(shown)))
        print("Regenerate it from the repository root with:\n    %s" % REGENERATE)
        return 1
    out = args.out or os.path.join(args.root, OUTPUT)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote " + out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
