#!/usr/bin/env bash
# check_ops_doc.sh PRINT_OPS DOC [--update]: the operator list in DOC, between the lines
# `<!-- ops.def begin -->` and `<!-- ops.def end -->`, must be what PRINT_OPS prints from
# compiler/ir/ops.def. With --update, rewrite that section of DOC instead.
set -euo pipefail
print_ops=$1 doc=$2 mode=${3:-check}
begin='<!-- ops.def begin -->' end='<!-- ops.def end -->'
grep -qxF "$begin" "$doc" && grep -qxF "$end" "$doc" || { echo "$doc: no '$begin' ... '$end' section" >&2; exit 1; }
want=$(mktemp) have=$(mktemp)
trap 'rm -f "$want" "$have"' EXIT
"$print_ops" > "$want"
awk -v b="$begin" -v e="$end" '$0 == e { inside = 0 } inside { print } $0 == b { inside = 1 }' "$doc" > "$have"
if [ "$mode" = --update ]; then
  awk -v b="$begin" -v e="$end" -v table="$want" '
    $0 == e { while ((getline line < table) > 0) print line; inside = 0 }
    !inside { print }
    $0 == b { inside = 1 }' "$doc" > "$doc.new" && mv "$doc.new" "$doc"
  exit 0
fi
if ! diff -u "$have" "$want"; then
  echo "$doc: the operator list differs from compiler/ir/ops.def (- the doc, + the table)." >&2
  echo "Regenerate it: tests/ops/check_ops_doc.sh build/tests/ops/print_ops docs/compiler.md --update" >&2
  exit 1
fi
