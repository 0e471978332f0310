#!/usr/bin/env python3
"""Config fuzzer (issue 10): mutated YAML config files must give a config error that names
the key (or the file, when the YAML itself is broken), with a non-zero exit: never a crash,
a hang, or a bad value silently accepted.

Usage: config_fuzz_test.py SHARDGAN_TRAIN SHARDGAN_CKPT SOURCE_DIR [--seed N] [--workers N] [--all] [--keep]
Runs with the project's environment's Python (.venv: PyYAML reads the shipped configs; the mutated files
are written by this script, not by PyYAML). SHARDGAN_CKPT is not used. ctest: config_fuzz
(tests/fuzz_tests.cmake).

Every case is `shardgan-train FILE --dry-run` (one rank, no mpirun), which loads and checks
the config and prints the memory pre-flight without training. The base files are
configs/fmnist-dcgan.yaml and, for the BigGAN keys, configs/fmnist-biggan.yaml, both written
back in block style with run.dir in a temporary directory. Mutations, seeded:
- wrong types: text, fractions, booleans, lists and maps where a number, a boolean, a name
  or a list belongs, empty (null) values, and names that are not among the allowed ones;
- negative sizes and out-of-range values: one step outside each key's domain as the code
  documents it (> 0, >= 0, [0, 1), a stage of 4, ...);
- huge numbers: past int64, uint64 or double range, .inf and .nan, and huge values that are
  valid (train.steps = 2^62 must still be accepted);
- unknown keys: misspelled keys, new sections, keys under a value, odd characters;
- duplicate keys: a key twice in its map (same or another value), a section twice, and one
  key spelled both as "a.b:" and "a: {b:}";
- binary garbage: the whole file replaced by random bytes, random bytes (with control or
  non-UTF-8 bytes) at the start of a line, NUL bytes;
- deep nesting: flow lists and maps 10^4 to 10^5 deep, 3000 levels of block maps, a key
  nested 50 deep under a real key, and an alias bomb (40 levels, each referring twice to
  the one before, 2^40 nodes when expanded);
- a few other shapes: an empty file and the untouched bases (must be accepted), a list or
  a scalar at the top level, a second YAML document, tabs for indentation.

Each case expects either `error` (exit status 1 within 60 s, no signal, the message names
the config file and the key, no pre-flight JSON printed) or `ok` (exit 0 with the
pre-flight JSON). Anything else fails: a signal, a hang, exit 0 where an error was due,
an error where the value is valid, or an error that does not name the key. Children run
with a 6 GiB address-space limit, so that a value that makes the process allocate without
bound fails fast instead of swapping the machine.

Known defects (KNOWN below) are cases expected to fail for a reason outside the config
loader; they must still end cleanly (no signal, no hang, non-zero exit) and are reported as
XFAIL; once they give the config error they are reported as XPASS and fail the test until
they are removed from KNOWN, so that the list cannot go stale. It held the huge model
dimensions (model.z_dim, model.g_width, ... = 2^40 or 2^62), which the families accepted
("> 0" only) and the pre-flight then tried to allocate or overflowed on; the families now
bound every dimension (src/models/*), and the list is empty.

Shown to fail:
- With SHARDGAN_FUZZ_SELFTEST=1 the script adds a config with an unknown key that it
  expects to be accepted; it reported (seed 1)
    FAIL #126 selftest dcgan: selftest: an unknown key, expected ok (expect ok): expected ok,
      got exit 1: ... unknown config key 'train.selftest_key'. ...
  and exited 1.
- Inputs of these categories, run by hand against the build before the fixes that came with
  this test, were accepted or hung: a duplicate key (the later value silently won), a second
  YAML document (silently ignored), "key: {}" (silently the default), lr: .inf,
  momentum: -5, alpha: 7, ema.start_step: -5, dist.timeout_s: .inf, and an alias bomb
  (73 s and 7 GB before std::bad_alloc). Fixed in src/train/config.cpp and
  src/util/config_reader.cpp.

Runtime: a seeded sample per category (CAPS), about 126 cases, about 1.5 minutes on a
2-core machine; --all runs all ~294.
"""
import argparse
import concurrent.futures
import copy
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import yaml

TIMEOUT_S = 60
AS_LIMIT = 6 << 30
# Cases run per category (None: all); --all runs every generated one (about 290).
CAPS = {"wrong-type": 24, "out-of-range": 28, "valid": 6, "huge": 16, "huge-model": None, "unknown": 8,
        "duplicate": None, "garbage": None, "nesting": None, "other": None, "selftest": None}

# Every key the shipped configs and the code read, with its domain as the code checks it
# (src/train/config.cpp, src/models/dcgan/dcgan.cpp, src/models/biggan/biggan.cpp).
# kind: int, uint, float, bool, str, enum, list. `bad`: values outside the domain
# (negative sizes, out of range); `good`: unusual values inside it.
OPT = {
    "type": ("enum", ["adam", "adamw", "sgd", "rmsprop"]),
    "lr": ("float", {"bad": ["0", "-1e-4"], "good": ["1e300"]}),
    "beta1": ("float", {"bad": ["1", "-0.1", "1.5"]}),
    "beta2": ("float", {"bad": ["1.0", "-1e-9"]}),
    "eps": ("float", {"bad": ["-1e-8"], "good": ["0"]}),
    "weight_decay": ("float", {"bad": ["-0.5"]}),
    "momentum": ("float", {"bad": ["-5", "1", "7"]}),
    "dampening": ("float", {"bad": ["-0.1", "2"]}),
    "nesterov": ("bool", {}),
    "alpha": ("float", {"bad": ["-1", "7", "1"]}),
    "centered": ("bool", {}),
    "schedule": ("enum", ["constant", "linear_warmup", "cosine", "step"]),
    "warmup_steps": ("int", {"bad": ["-3"]}),
    "total_steps": ("int", {"bad": ["-1"]}),
    "min_lr": ("float", {"bad": ["-1e-5"]}),
    "step_size": ("int", {"bad": ["-10"]}),
    "gamma": ("float", {"bad": ["0", "-0.5"]}),
}
SHARD = {
    "stage": ("int", {"bad": ["4", "-1", "3000000000"]}),
    "reshard_after_forward": ("bool", {}),
    "compute_dtype": ("enum", ["auto", "float32", "float64", "bfloat16", "float16"]),
    "reduce_dtype": ("enum", ["auto", "float32", "float64", "bfloat16", "float16"]),
}
SCHEMA = {
    "run.dir": ("str", {}),
    "run.seed": ("uint", {"bad": ["-1"], "good": ["18446744073709551615"]}),
    "data.source": ("enum", ["fashion-mnist", "synthetic", "hdf5"]),
    "data.path": ("str", {}),
    "data.synthetic_size": ("int", {"bad": ["0", "-96"]}),
    "data.prefetch_batches": ("int", {"bad": ["0", "-4", "1025"]}),
    "train.eval_every": ("int", {"bad": ["-1"], "good": ["0"]}),
    "train.eval_samples": ("int", {"bad": ["0", "1", "-2000", "10000001"]}),
    "train.plots": ("bool", {}),
    "eval.enabled": ("bool", {}),
    "eval.classifier": ("str", {}),
    "eval.reference": ("str", {}),
    "train.steps": ("int", {"bad": ["-1"], "good": ["4611686018427387904", "0"]}),
    "train.global_batch": ("int", {"bad": ["0", "-64"]}),
    "train.micro_batches": ("int", {"bad": ["0", "-1", "7"]}),
    "train.log_every": ("int", {"bad": ["0", "-20"]}),
    "train.sample_every": ("int", {"bad": ["-200"], "good": ["0"]}),
    "train.checkpoint_every": ("int", {"bad": ["-1"], "good": ["4611686018427387904"]}),
    "train.keep_checkpoints": ("int", {"bad": ["0", "-3"]}),
    "train.grad_clip": ("float", {"bad": ["-1"]}),
    "train.threads": ("int", {"bad": ["-1", "1025", "4611686018427387904"]}),
    "train.d_steps": ("int", {"bad": ["0"]}),
    "train.loss": ("enum", ["nonsaturating", "hinge"]),
    "train.skip_memory_check": ("bool", {}),
    "model.dtype": ("enum", ["float32", "float64"]),
    "model.arch": ("enum", ["dcgan", "biggan"]),
    "ema.enabled": ("bool", {}),
    "ema.decay": ("float", {"bad": ["1.5", "-0.01"]}),
    "ema.start_step": ("int", {"bad": ["-5"]}),
    "loss_scale.init_scale": ("float", {"bad": ["0", "-65536"], "good": ["1e300"]}),
    "loss_scale.growth_interval": ("int", {"bad": ["0"]}),
    "loss_scale.hysteresis": ("int", {"bad": ["0", "-2"]}),
    "dist.backend": ("enum", ["mpi", "nccl"]),
    "dist.timeout_s": ("float", {"bad": ["0", "-600", "1e300"]}),
}
for who in ("generator", "discriminator"):
    for k, v in OPT.items():
        SCHEMA[f"optim.{who}.{k}"] = v
    for k, v in SHARD.items():
        SCHEMA[f"sharding.{who}.{k}"] = v
DCGAN = {
    "model.z_dim": ("int", {"bad": ["0", "-16"], "huge": True}),
    "model.g_width": ("int", {"bad": ["0", "-8"], "huge": True}),
    "model.d_width": ("int", {"bad": ["-1"], "huge": True}),
    "model.channels": ("int", {"bad": ["2", "0", "-3"]}),
}
BIGGAN = {
    "model.ch": ("int", {"bad": ["0", "-16"], "huge": True}),
    "model.d_ch": ("int", {"bad": ["-1"], "huge": True}),
    "model.g_ch_mult": ("list", {"bad": ["[4, -4, 2, 1]", "[4]", "[0, 4, 2, 1]"]}),
    "model.d_ch_mult": ("list", {"bad": ["[1, 2, 4]", "[1, 2, -4, 4]"]}),
    "model.g_blocks_per_res": ("int", {"bad": ["-1"]}),
    "model.d_blocks_per_res": ("int", {"bad": ["-2"]}),
    "model.g_attn": ("int", {"bad": ["12", "-16", "64"]}),
    "model.d_attn": ("int", {"bad": ["3", "32"]}),
    "model.z_dim": ("int", {"bad": ["0", "65"], "huge": True}),
    "model.shared_dim": ("int", {"bad": ["0"]}),
    "model.n_classes": ("int", {"bad": ["0", "-10"], "huge": True}),
    "model.channels": ("int", {"bad": ["2"]}),
    "model.init": ("enum", ["ortho", "N02", "xavier"]),
}
# (base, key) pairs whose huge values fail today outside the config loader (see the header).
# Empty since the families bound their dimensions (65536 channels, 2^20 classes): keep the
# mechanism, so that a regression shows up as XFAIL-free failures rather than silently.
KNOWN = set()

WRONG = {
    "int": ["abc", "1.5", "true", "[1, 2]", "{a: 1}", "", "12abc", "0x", "1e3", "'7 7'"],
    "uint": ["abc", "2.5", "false", "[1]", "{a: 1}", "", "1e3"],
    "float": ["abc", "true", "[1.0]", "{a: 1}", "", "1.0.0", "0x1p3", "1e", "'-'"],
    "bool": ["maybe", "2", "[true]", "{a: 1}", "", "truee", "0.5"],
    "enum": ["[a, b]", "{a: 1}", "", "nonsense", "UPPER", "7", "true"],
    "str": ["[a, b]", "{a: 1}", "[]", "{}"],
    "list": ["5", "abc", "[1, x]", "[1.5, 2]", "{a: 1}", "[[1], [2]]", "", "[1, 2"],
}
OVERFLOW = {
    "int": ["9223372036854775808", "-9223372036854775809", "99999999999999999999999", "1e400"],
    "uint": ["18446744073709551616", "340282366920938463463374607431768211456"],
    "float": ["1e400", "-1e400", ".inf", "-.inf", ".nan", ".NaN", ".Inf"],
}


def tree_from(path, run_dir):
    """The base config as [key, value-text | subtree] pairs, in file order."""
    with open(path) as f:
        data = yaml.safe_load(f)

    def text(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        return str(v)

    def conv(d):
        return [[k, conv(v) if isinstance(v, dict) else text(v)] for k, v in d.items()]

    t = conv(data)
    set_key(t, "run.dir", run_dir)
    return t


def find(tree, key, create=False):
    """The pair list holding the leaf `key` ("a.b.c") and the leaf's name."""
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        sub = next((kv for kv in node if kv[0] == p and isinstance(kv[1], list)), None)
        if sub is None:
            if not create:
                return None, parts[-1]
            sub = [p, []]
            node.append(sub)
        node = sub[1]
    return node, parts[-1]


def set_key(tree, key, value):
    node, leaf = find(tree, key, create=True)
    for kv in node:
        if kv[0] == leaf:
            kv[1] = value
            return
    node.append([leaf, value])


def get_key(tree, key):
    node, leaf = find(tree, key)
    return next((kv[1] for kv in node or [] if kv[0] == leaf), None)


def emit(tree, indent=0):
    out = []
    for k, v in tree:
        if isinstance(v, list):
            out.append(" " * indent + f"{k}:\n" + emit(v, indent + 2))
        else:
            out.append(" " * indent + f"{k}: {v}\n")
    return "".join(out)


class Case:
    def __init__(self, cat, name, content, expect, key=None, base=None, known=False):
        self.cat, self.name, self.content, self.expect, self.key = cat, name, content, expect, key
        self.base, self.known = base, known


def make_cases(rng, bases, tmp):
    cases = []

    def add_value(cat, base, key, value, expect, known=False):
        t = copy.deepcopy(bases[base][0])
        set_key(t, key, value)
        cases.append(Case(cat, f"{base}: {key} = {value!r}", emit(t).encode(), expect, key, base, known))

    schemas = {"dcgan": {**SCHEMA, **DCGAN}, "biggan": {**SCHEMA, **BIGGAN}}
    for base in ("dcgan", "biggan"):
        cases.append(Case("other", f"{base}: the base config", emit(bases[base][0]).encode(), "ok", None, base))
    # Wrong types: every key once (a seeded pick of its wrong values), BigGAN's model keys
    # on the BigGAN base.
    for base, schema in schemas.items():
        for key, (kind, dom) in sorted(schema.items()):
            if base == "biggan" and key in SCHEMA:
                continue
            pool = list(WRONG[kind])
            if kind == "enum":
                pool = [v for v in pool if v not in dom]
            add_value("wrong-type", base, key, rng.choice(pool), "error")
    # Negative sizes and out-of-range values: every listed one.
    for base, schema in schemas.items():
        for key, (kind, dom) in sorted(schema.items()):
            if base == "biggan" and key in SCHEMA:
                continue
            for v in (dom.get("bad", []) if isinstance(dom, dict) else []):
                add_value("out-of-range", base, key, v, "error")
            for v in (dom.get("good", []) if isinstance(dom, dict) else []):
                add_value("valid", base, key, v, "ok")
    # Huge numbers.
    numeric = [(k, kind) for k, (kind, _) in sorted(schemas["dcgan"].items()) if kind in OVERFLOW]
    for key, kind in rng.sample(numeric, 14):
        add_value("huge", "dcgan", key, rng.choice(OVERFLOW[kind]), "error")
    for kind in OVERFLOW:  # every overflow spelling once
        key = rng.choice([k for k, kd in numeric if kd == kind])
        for v in OVERFLOW[kind]:
            add_value("huge", "dcgan", key, v, "error")
    for base, schema in schemas.items():
        for key, (kind, dom) in sorted(schema.items()):
            if isinstance(dom, dict) and dom.get("huge") and (base == "dcgan" or key not in SCHEMA):
                v = rng.choice(["1099511627776", "4611686018427387904"])
                add_value("huge-model", base, key, v, "error", known=(base, key) in KNOWN)
    # Unknown keys: misspelled or new keys and sections, and keys under a value (the value
    # becomes a map).
    for key in ["train.stepz", "train.Steps", "optim.generator.learning_rate", "foo.bar", "model.g_widht",
                "sharding.gen.stage", "em\u0430.decay", "data.source_", "Train.steps", "train.log every"]:
        t = copy.deepcopy(bases["dcgan"][0])
        set_key(t, key, "1")
        cases.append(Case("unknown", f"dcgan: unknown key {key!r}", emit(t).encode(), "error", key.strip(),
                          "dcgan"))
    for parent, leaf in [("train.steps", "extra"), ("ema.decay", "x"), ("run.dir", "d"),
                         ("optim.generator.lr", "lr")]:
        t = copy.deepcopy(bases["dcgan"][0])
        set_key(t, parent, "{" + leaf + ": 1}")
        cases.append(Case("unknown", f"dcgan: key {leaf} under the value of {parent}", emit(t).encode(), "error",
                          f"{parent}.{leaf}", "dcgan"))
    t = copy.deepcopy(bases["dcgan"][0])
    t.append(["toplevel", "3"])
    cases.append(Case("unknown", "dcgan: unknown top-level key", emit(t).encode(), "error", "toplevel", "dcgan"))
    # Duplicate keys.
    leaves = [k for k in sorted(schemas["dcgan"]) if get_key(bases["dcgan"][0], k) is not None]
    for key in rng.sample(leaves, 5):
        t = copy.deepcopy(bases["dcgan"][0])
        node, leaf = find(t, key)
        old = get_key(t, key)
        node.append([leaf, old if rng.random() < 0.5 else rng.choice(["1", "0", "-1", "auto"])])
        cases.append(Case("duplicate", f"dcgan: {key} twice", emit(t).encode(), "error", key, "dcgan"))
    t = copy.deepcopy(bases["dcgan"][0])
    t.append(["train", [["steps", "7"]]])
    cases.append(Case("duplicate", "dcgan: section train twice", emit(t).encode(), "error", "train", "dcgan"))
    t = copy.deepcopy(bases["dcgan"][0])
    t.append(["train.steps", "7"])
    cases.append(Case("duplicate", "dcgan: train.steps as 'train.steps:' and in train:", emit(t).encode(), "error",
                      "train.steps", "dcgan"))
    t = copy.deepcopy(bases["dcgan"][0])
    t.insert(0, ["model", [["g_width", "9"]]])
    cases.append(Case("duplicate", "dcgan: section model twice, the first one partial", emit(t).encode(), "error",
                      "model", "dcgan"))
    # Binary garbage.
    base_text = emit(bases["dcgan"][0]).encode()
    for i in range(4):
        n = rng.choice([1, 16, 256, 4096])
        g = bytes(rng.randrange(256) for _ in range(n))
        if g[:1] in (b"#", b" ", b"\t", b"\n", b"\r", b"-", b"%", b".", b"\xef"):
            g = b"\x01" + g  # not a comment, a document marker, a directive or a BOM
        cases.append(Case("garbage", f"dcgan: whole file is {n} random bytes", g, "error", None, "dcgan"))
    lines = base_text.split(b"\n")
    for i in range(6):
        at = rng.randrange(len(lines) - 1)
        g = bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        g = bytes([rng.choice([0x00, 0x01, 0x07, 0x1b, 0x7f, 0xc3, 0xff, 0xfe])]) + g
        mutated = b"\n".join(lines[:at] + [g + lines[at]] + lines[at + 1:])
        cases.append(Case("garbage", f"dcgan: {len(g)} random bytes at the start of line {at + 1}", mutated,
                          "error", None, "dcgan"))
    cases.append(Case("garbage", "dcgan: a NUL byte before a section", base_text.replace(b"train:", b"\0train:", 1),
                      "error", None, "dcgan"))
    cases.append(Case("garbage", "dcgan: NUL bytes in a value", base_text.replace(b"steps: ", b"steps: 6\0\0", 1),
                      "error", None, "dcgan"))
    # Deep nesting.
    for name, text in [("flow lists 100000 deep", "x: " + "[" * 100000 + "]" * 100000),
                       ("flow maps 10000 deep", "x: " + "{a: " * 10000 + "1" + "}" * 10000),
                       ("block maps 3000 deep", "".join("  " * i + "a:\n" for i in range(3000)) + "  " * 3000 + "b: 1"),
                       ("flow lists 10000 deep, unclosed", "x: " + "[" * 10000)]:
        cases.append(Case("nesting", f"dcgan: {name}", base_text + b"\n" + text.encode() + b"\n", "error", None,
                          "dcgan"))
    t = copy.deepcopy(bases["dcgan"][0])
    set_key(t, "train.steps", "{a: " * 50 + "1" + "}" * 50)
    cases.append(Case("nesting", "dcgan: train.steps holds maps 50 deep", emit(t).encode(), "error", "train.steps",
                      "dcgan"))
    t = copy.deepcopy(bases["biggan"][0])
    set_key(t, "model.g_ch_mult", "[" * 40 + "1" + "]" * 40)
    cases.append(Case("nesting", "biggan: model.g_ch_mult holds lists 40 deep", emit(t).encode(), "error",
                      "model.g_ch_mult", "biggan"))
    bomb = "a0: &a0 {x: 1, y: 1}\n" + "".join(f"a{i}: &a{i} {{x: *a{i - 1}, y: *a{i - 1}}}\n" for i in range(1, 40))
    cases.append(Case("nesting", "dcgan: alias bomb of maps (2^40 nodes expanded)",
                      base_text + b"\n" + bomb.encode(), "error", None, "dcgan"))
    bomb = "e0: &e0 {}\n" + "".join(f"e{i}: &e{i} {{x: *e{i - 1}, y: *e{i - 1}}}\n" for i in range(1, 40))
    cases.append(Case("nesting", "dcgan: alias bomb of empty maps",
                      base_text + b"\n" + bomb.encode(), "error", None, "dcgan"))
    bomb = "l0: &l0 [1, 1]\n" + "".join(f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]\n" for i in range(1, 40))
    cases.append(Case("nesting", "dcgan: alias bomb of lists", base_text + b"\n" + bomb.encode(), "error", None,
                      "dcgan"))
    # Other shapes.
    cases.append(Case("other", "an empty file", b"", "ok", None, "dcgan"))
    cases.append(Case("other", "a top-level list", b"- train\n- model\n", "error", None, "dcgan"))
    cases.append(Case("other", "a top-level scalar", b"hello\n", "error", None, "dcgan"))
    cases.append(Case("other", "dcgan: a second YAML document", base_text + b"\n---\ntrain: {steps: -5}\n", "error",
                      None, "dcgan"))
    cases.append(Case("other", "dcgan: a tab for indentation", base_text.replace(b"\n  steps", b"\n\tsteps", 1),
                      "error", None, "dcgan"))
    cases.append(Case("other", "dcgan: 20000 keys in one section",
                      base_text + b"\nmany:\n" + b"".join(b"  k%d: 1\n" % i for i in range(20000)), "error", None,
                      "dcgan"))
    if os.environ.get("SHARDGAN_FUZZ_SELFTEST") == "1":
        t = copy.deepcopy(bases["dcgan"][0])
        set_key(t, "train.selftest_key", "1")
        cases.append(Case("selftest", "dcgan: selftest: an unknown key, expected ok", emit(t).encode(), "ok",
                          None, "dcgan"))
    return cases


def run_case(train, tmp, env, i, case):
    path = f"{tmp}/case-{i:03d}.yaml"
    with open(path, "wb") as f:
        f.write(case.content)
    # The address-space limit through the shell (preexec_fn is unsafe with threads). An
    # AddressSanitizer build (scripts/sanitize.sh sets SHARDGAN_SANITIZE) reserves ~15 TB of
    # shadow address space at start, so it cannot run under ulimit -v; there ASan's own
    # hard_rss_limit_mb (added to ASAN_OPTIONS in main) bounds the memory instead.
    limit = "" if os.environ.get("SHARDGAN_SANITIZE") else f"ulimit -v {AS_LIMIT >> 10} && "
    cmd = ["/bin/sh", "-c", limit + 'exec "$0" "$@"', train, path, "--dry-run"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return path, "hang", "", ""
    return path, p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def judge(case, path, rc, out, err):
    """(verdict, message): verdict is ok, fail, xfail or xpass."""
    if rc == "hang":
        return "fail", f"hung (killed after {TIMEOUT_S} s)"
    if rc < 0:
        return "fail", f"killed by signal {-rc} ({signal.Signals(-rc).name}): {err.strip()[-300:]}"
    msg = next((l for l in err.splitlines() if "error" in l), err.strip()[-300:])
    if case.expect == "ok":
        if rc == 0 and out.lstrip().startswith("{"):
            return "ok", "accepted (pre-flight printed)"
        return "fail", f"expected ok, got exit {rc}: {msg[:300]}"
    problems = []
    if rc == 0:
        problems.append("accepted (exit 0)")
    elif rc != 1:
        problems.append(f"exit status {rc}")
    if out.lstrip().startswith("{"):
        problems.append("printed the pre-flight")
    if path not in msg:
        problems.append("the message does not name the file")
    if case.key and f"'{case.key}'" not in msg:  # quoted, as the config errors write keys
        problems.append(f"the message does not name '{case.key}'")
    if case.known and rc == 0:
        return "fail", "known defect, but now accepted (exit 0)"
    if case.known:
        return ("xfail", f"known defect: {'; '.join(problems)}: {msg[:200]}") if problems else \
            ("xpass", f"now a config error naming the key, remove it from KNOWN: {msg[:200]}")
    if problems:
        return "fail", "; ".join(problems) + f": {msg[:300]}"
    return "ok", msg[:200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("ckpt")
    ap.add_argument("src")
    ap.add_argument("--seed", type=int, default=1)
    # A failing dry-run spends half its time waiting in MPI_Abort: one more worker than cores.
    ap.add_argument("--workers", type=int, default=(os.cpu_count() or 2) + 1)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--all", action="store_true", help="run every generated case, not a sample per category")
    args = ap.parse_args()
    args.train, args.ckpt, args.src = (os.path.abspath(x) for x in (args.train, args.ckpt, args.src))
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="shardgan-config-fuzz.")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if env.get("SHARDGAN_SANITIZE"):  # the bound that replaces ulimit -v, for these runs only
        env["ASAN_OPTIONS"] = ":".join(x for x in (env.get("ASAN_OPTIONS"), f"hard_rss_limit_mb={AS_LIMIT >> 20}") if x)
    rng = random.Random(args.seed)
    bases = {b: (tree_from(f"{args.src}/configs/fmnist-{b}.yaml", f"{tmp}/run-{b}"),) for b in ("dcgan", "biggan")}
    cases = make_cases(rng, bases, tmp)
    generated = len(cases)
    if not args.all:  # a seeded sample of each category (order kept), to stay within ~2 minutes
        keep = set()
        for cat, cap in CAPS.items():
            idx = [i for i, c in enumerate(cases) if c.cat == cat]
            keep.update(idx if cap is None or len(idx) <= cap else rng.sample(idx, cap))
        cases = [c for i, c in enumerate(cases) if i in keep or c.cat not in CAPS]
    print(f"{len(cases)} mutated configs of {generated} generated (seed {args.seed}"
          f"{', all' if args.all else ''})", flush=True)
    results = [None] * len(cases)
    with concurrent.futures.ThreadPoolExecutor(args.workers) as ex:
        futs = {ex.submit(run_case, args.train, tmp, env, i, c): i for i, c in enumerate(cases)}
        for fut in concurrent.futures.as_completed(futs):
            i = futs[fut]
            results[i] = judge(cases[i], *fut.result())
    failures = []
    counts = Counter()
    by_cat = {}
    for i, (case, (verdict, msg)) in enumerate(zip(cases, results)):
        counts[verdict] += 1
        by_cat.setdefault(case.cat, Counter())[verdict] += 1
        tag = {"ok": "PASS", "xfail": "XFAIL", "fail": "FAIL", "xpass": "FAIL"}[verdict]
        name = case.name if len(case.name) < 120 else case.name[:117] + "..."
        print(f"{tag} #{i:03d} {case.cat} {name} (expect {case.expect}): {msg}".replace("\0", "\\0"))
        if tag == "FAIL":
            failures.append(f"#{i:03d} {case.cat} {name}: {msg}")
    print()
    for cat, c in by_cat.items():
        print(f"{cat:14s} {sum(c.values()):4d} cases: {c['ok']} pass, {c['fail'] + c['xpass']} fail, "
              f"{c['xfail']} known defects")
    print(f"{len(cases)} cases: {counts['ok']} pass, {counts['fail'] + counts['xpass']} fail, "
          f"{counts['xfail']} known defects (XFAIL); {time.time() - t0:.0f} s")
    if args.keep:
        print("kept", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL:", f.replace("\0", "\\0"))
    print(f"{'FAILED' if failures else 'PASSED'}: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
