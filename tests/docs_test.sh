#!/usr/bin/env bash
# The user documentation against the code: docs_test.sh TRAIN SRC
#  1. docs/config.md is exactly `shardgan-train --config-reference`: a key the reader accepts
#     and the page lacks, or a key on the page the reader no longer has, fails (regenerate
#     with `build/shardgan-train --config-reference > docs/config.md`).
#  2. --print-config of each shipped config parses back to the same resolved config.
#  3. User pages (README.md, LICENSE-adjacent pages, docs/*.md outside docs/history/) carry no
#     diary words: "session(s)" or "issue N".
#  4. Every relative link of a user page names a file that exists.
TRAIN=$1; SRC=$2
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d)

if "$TRAIN" --config-reference > "$T/config.md" 2> "$T/err.txt"; then
  if diff -u "$SRC/docs/config.md" "$T/config.md" > "$T/diff.txt"; then
    ok "docs/config.md equals --config-reference ($(grep -c '^| `' "$T/config.md") keys)"
  else
    bad "docs/config.md differs from --config-reference (regenerate it): $(head -20 "$T/diff.txt")"
  fi
  empty=$(grep '^| `' "$T/config.md" | awk -F' \\| ' '{ m=$NF; sub(/ \|$/, "", m); if (m == "" || m == "|") print $1 }')
  [ -z "$empty" ] && ok "every key has a meaning" || bad "keys without a meaning: $empty"
else
  bad "--config-reference failed: $(tail -3 "$T/err.txt")"
fi

for cfg in "$SRC"/configs/*.yaml; do
  name=$(basename "$cfg")
  if "$TRAIN" "$cfg" --set train.steps=7 --print-config > "$T/resolved.yaml" 2> "$T/err.txt" &&
     "$TRAIN" "$T/resolved.yaml" --print-config > "$T/again.yaml" 2>> "$T/err.txt"; then
    if cmp -s "$T/resolved.yaml" "$T/again.yaml" && grep -q '^  steps: 7$' "$T/resolved.yaml"; then
      ok "$name: --print-config reads back to the same config"
    else
      bad "$name: --print-config does not read back: $(diff "$T/resolved.yaml" "$T/again.yaml" | head -5)"
    fi
  else
    bad "$name: --print-config failed: $(tail -3 "$T/err.txt")"
  fi
done

pages=("$SRC/README.md")
for f in "$SRC"/docs/*.md; do pages+=("$f"); done
hits=$(grep -HniwE 'sessions?|issues? #?[0-9]+' "${pages[@]}" | sed "s|$SRC/||")
[ -z "$hits" ] && ok "no diary words in ${#pages[@]} user pages" || bad "diary words in user pages: $(echo "$hits" | head -10)"

missing=""
for f in "${pages[@]}"; do
  dir=$(dirname "$f")
  # [text](target): relative targets only, anchors dropped.
  # Outside fenced code blocks (code may hold "](" of its own).
  for link in $(awk '/^ *```/ { code = !code; next } !code' "$f" | grep -oE '\]\([^)#[:space:]]+' | sed 's/^](//' |
                grep -vE '^(https?|mailto):'); do
    [ -e "$dir/$link" ] || missing+=" $(basename "$f"):$link"
  done
done
[ -z "$missing" ] && ok "every relative link of the user pages exists" || bad "broken links:$missing"

rm -rf "$T"
finish
