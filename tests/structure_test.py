"""The source tree's structure (ctest `structure`; docs/design.md, "Layers"):
  - no file under src/ is over 600 lines;
  - no file includes a header of a higher layer. The layers, lowest first:
      util < h5 < device < comm < offload < sharding < nn < optim < data < models < eval
        < checkpoint < train < {tools, apps}
    A layer is the directories src/<layer>/ and include/shardgan/<layer>/ (src/models/<family>/
    are all `models`); tools/ and apps/ are above train. An include names its layer as
    "shardgan/<layer>/..." (public headers), "<layer>/..." (a layer's private headers under
    src/), or a bare "file.h" (the including file's own directory, so its own layer);
    angle-bracket <shardgan/...> includes count too. A directory under src/ or
    include/shardgan/ that is not in the order is reported: add it to LAYERS and to
    docs/design.md.
Prints one line per finding (path:line: what) and exits 1 if there is any, 0 otherwise.

  structure_test.py [ROOT]     check the tree at ROOT (default: this checkout)
  structure_test.py --graph    also print which layer includes which (the order the code has)
  structure_test.py --self-test
      negative control (ctest `structure_control`): runs the check as a program on a
      synthetic tree in a temporary directory, with a 601-line file, a 600-line one, lower
      layers including higher ones (public, private and header forms), allowed includes and
      a directory outside the order; exits 0 only if the check exits 1 and reports exactly
      the expected findings."""
import collections
import os
import re
import subprocess
import sys
import tempfile

LAYERS = ["util", "h5", "device", "comm", "offload", "sharding", "nn", "optim", "data", "models", "eval",
          "checkpoint", "train"]
TOP = ["tools", "apps"]  # above train, and not below each other
RANK = {name: i for i, name in enumerate(LAYERS)}
RANK.update({name: len(LAYERS) for name in TOP})
MAX_LINES = 600
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(shardgan/[^>]+)>)')


def layer_of_file(rel):
    """The layer of a file (path relative to the root): its directory under src/ or
    include/shardgan/ (which check() reports if it is not in the order), tools or apps;
    None outside the layered tree."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "shardgan"] and len(parts) > 3:
        return parts[2]
    if parts[0] in TOP:
        return parts[0]
    return None


def layer_of_include(including_layer, target):
    """The layer an include names, or None for a header outside the project's layers."""
    parts = target.split("/")
    if parts[0] == "shardgan" and len(parts) > 2:
        return parts[1]
    if len(parts) == 1:
        return including_layer  # the including file's own directory
    if parts[0] in RANK:
        return parts[0]
    return None


def sources(root):
    for top in ("src", "include", "tools", "apps"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXT):
                    path = os.path.join(dirpath, name)
                    yield path, os.path.relpath(path, root).replace(os.sep, "/")


def check(root):
    """(findings, edges, counts): findings are 'path:line: text' strings; edges maps
    (from layer, to layer) to the places that include across layers."""
    findings, edges = [], collections.defaultdict(list)
    unknown = set()
    n_files = n_includes = 0
    for path, rel in sources(root):
        layer = layer_of_file(rel)
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        n_files += 1
        if rel.startswith("src/") and len(lines) > MAX_LINES:
            findings.append(f"{rel}:{len(lines)}: {len(lines)} lines, over {MAX_LINES}")
        if layer is None:
            continue
        if layer not in RANK:
            if layer not in unknown:
                unknown.add(layer)
                findings.append(f"{rel}:1: directory '{layer}' is not a layer of the order "
                                f"({' < '.join(LAYERS)} < {{{', '.join(TOP)}}}); add it to "
                                f"tests/structure_test.py's LAYERS and to docs/design.md")
            continue
        for i, text in enumerate(lines, 1):
            m = INCLUDE.match(text)
            if not m:
                continue
            target = m.group(1) or m.group(2)
            to = layer_of_include(layer, target)
            if to is None or to == layer:
                continue
            n_includes += 1
            edges[(layer, to)].append(f"{rel}:{i}")
            if to not in RANK:
                findings.append(f"{rel}:{i}: includes \"{target}\" of '{to}', which is not a layer of the order")
            elif RANK[to] > RANK[layer] or (to in TOP and layer in TOP):
                findings.append(f"{rel}:{i}: layer '{layer}' includes \"{target}\" of the higher layer '{to}'")
    return findings, edges, (n_files, n_includes)


def main(argv):
    graph = "--graph" in argv
    args = [a for a in argv if a != "--graph"]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    findings, edges, (n_files, n_includes) = check(root)
    if graph:
        print("layer includes (from -> to: how many places):")
        for (a, b), places in sorted(edges.items(), key=lambda e: (RANK.get(e[0][0], 99), RANK.get(e[0][1], 99))):
            print(f"  {a} -> {b}: {len(places)}")
    for line in findings:
        print(line)
    print(f"{n_files} files, {n_includes} includes across layers; order "
          f"{' < '.join(LAYERS)} < {{{', '.join(TOP)}}}, at most {MAX_LINES} lines a file under src/: "
          f"{len(findings)} findings")
    return 1 if findings else 0


def self_test():
    def write(root, rel, lines):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))

    filler = ["// filler"]
    with tempfile.TemporaryDirectory(prefix="shardgan-structure.") as root:
        write(root, "src/util/long.cpp", ['#include "shardgan/util/a.h"'] + filler * 600)   # 601 lines
        write(root, "src/util/at_limit.cpp", filler * 600)                                  # 600: allowed
        write(root, "include/shardgan/util/a.h", ["#pragma once"])
        write(root, "src/h5/up.cpp", ["// lower includes higher, public header", "",
                                      '#include "shardgan/train/trainer.h"'])
        write(root, "src/comm/up_private.cpp", ['#include "progress_thread.h"',     # own dir: allowed
                                                '#include "sharding/unit_collectives.h"'])  # private, higher
        write(root, "include/shardgan/device/up.h", ["#pragma once", "#include <shardgan/optim/adam.h>"])
        write(root, "src/models/biggan/ok.cpp", ['#include "models/dcgan/blocks.h"',  # same layer
                                                 '#include "shardgan/nn/sn.h"',       # lower
                                                 '#include "shardgan/checkpoint/x.h"'])  # higher
        write(root, "src/train/ok.cpp", ['#include "shardgan/util/a.h"', '#include "shardgan/checkpoint/x.h"',
                                         "#include <torch/torch.h>", '#include "shardgan_version.h"',
                                         '// #include "apps/x.h"'])
        write(root, "tools/tool.cpp", ['#include "shardgan/train/config.h"'])
        write(root, "src/extra/new.cpp", ["int x;"])
        expected = {
            "src/util/long.cpp:601": "601 lines, over 600",
            "src/h5/up.cpp:3": "layer 'h5' includes \"shardgan/train/trainer.h\" of the higher layer 'train'",
            "src/comm/up_private.cpp:2": "layer 'comm' includes \"sharding/unit_collectives.h\" of the higher "
                                         "layer 'sharding'",
            "include/shardgan/device/up.h:2": "layer 'device' includes \"shardgan/optim/adam.h\" of the higher "
                                              "layer 'optim'",
            "src/models/biggan/ok.cpp:3": "layer 'models' includes \"shardgan/checkpoint/x.h\" of the higher "
                                          "layer 'checkpoint'",
            "src/extra/new.cpp:1": "directory 'extra' is not a layer of the order",
        }
        run = subprocess.run([sys.executable, os.path.abspath(__file__), root], capture_output=True, text=True)
    out = run.stdout.splitlines()
    print("the check on the synthetic tree (exit %d):" % run.returncode)
    print("\n".join("  " + line for line in out) + (("\n  stderr: " + run.stderr) if run.stderr else ""))
    got = [line for line in out if re.match(r"^\S+:\d+: ", line)]
    ok = run.returncode == 1
    if not ok:
        print(f"FAIL: the check exited {run.returncode}, not 1")
    for where, text in expected.items():
        hits = [line for line in got if line.startswith(where + ": ") and text in line]
        print(("PASS" if hits else "FAIL") + f": reported {where}: {text}")
        ok = ok and bool(hits)
    extra = [line for line in got if not any(line.startswith(w + ": ") for w in expected)]
    for line in extra:
        print(f"FAIL: reported what it should not: {line}")
    ok = ok and not extra
    print("self-test " + ("passed: both kinds of finding reported, nothing else" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(self_test() if sys.argv[1:] == ["--self-test"] else main(sys.argv[1:]))
