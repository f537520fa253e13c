#!/usr/bin/env bash
# netc's compile time against the program's size: for each kind of large program, generate it at
# growing sizes, time `netc --check` (parse and semantic analysis) and `netc --dump=memplan` (the
# whole pipeline up to code generation), and print the time per line. Linear (or n log n)
# compilation shows as a roughly constant time per line down each table; a quadratic pass shows
# as a time per line that doubles with the size.
#   bench/compile_scaling.sh [NETC] [SIZES...]     (default: build/compiler/netc 12500 25000 50000 100000)
# Kinds: `consts` (N constants), `chain` (N assignments to new names), `calls` (N unlabeled
# calls of one block), `labeled` (N labeled block calls), `blocks` (N block definitions, each
# called once), `softmax` (N softmaxes in a chain: N library kernels, each value stored for the
# backward pass, which the memory plan must place), `dense` (N/20 dense layers: parameters, capped below netc's 10000-tensor limit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
netc=${1:-$root/build/compiler/netc}
shift || true
sizes=("$@")
((${#sizes[@]})) || sizes=(12500 25000 50000 100000)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gen() { # gen KIND N > file.net
  local kind=$1 n=$2
  echo "model scaling"
  echo "const batch = 4"
  echo "input x : f32[batch, 8]"
  echo "input label : i64[batch]"
  case $kind in
    consts) awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "const c%d = %d + 1\n", i, i }'
            echo "h = x" ;;
    chain)  echo "h0 = x"
            awk -v n="$n" 'BEGIN { for (i = 1; i <= n; i++) printf "h%d = h%d * 0.5 + 1\n", i, i - 1 }'
            echo "h = h$n" ;;
    calls)  printf 'block f(h) {\n  return relu(h) * 0.5 + h\n}\nh = x\n'
            awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) print "h = f(h)" }' ;;
    labeled) printf 'block f(h) {\n  return relu(h) * 0.5 + h\n}\nh = x\n'
            awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "h = l%d: f(h)\n", i }' ;;
    blocks) awk -v n="$n" 'BEGIN { for (i = 0; i < n / 4; i++) printf "block b%d(h) {\n  return h * 0.5\n}\n", i }'
            echo "h = x"
            awk -v n="$n" 'BEGIN { for (i = 0; i < n / 4; i++) printf "h = b%d(h)\n", i }' ;;
    softmax) echo "h = x"
            awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) print "h = softmax(h)" }' ;;
    dense)  echo "h = x"
            awk -v n="$n" 'BEGIN { m = int(n / 20); if (m > 4900) m = 4900; for (i = 0; i < m; i++) print "h = relu(dense(h, 8))" }' ;;
  esac
  printf 'logits = out: dense(h, 10)\ntrain {\n  loss = cross_entropy(logits, label)\n  optimizer = sgd(0.1)\n}\n'
}

seconds() { # seconds CMD... : wall time of one run
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null || { echo "compile_scaling: netc failed: $*" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}

printf '%-8s %8s %8s %12s %12s %14s %14s\n' kind size lines "check s" "memplan s" "check us/line" "memplan us/line"
for kind in consts chain calls labeled blocks softmax dense; do
  for n in "${sizes[@]}"; do
    f=$work/$kind$n.net
    gen "$kind" "$n" >"$f"
    lines=$(wc -l <"$f")
    c=$(seconds "$netc" "$f" --check) || exit 1
    m=$(seconds "$netc" "$f" --dump=memplan) || exit 1
    printf '%-8s %8d %8d %12.3f %12.3f %14.2f %14.2f\n' "$kind" "$n" "$lines" "$c" "$m" \
      "$(echo "$c * 1000000 / $lines" | bc -l)" "$(echo "$m * 1000000 / $lines" | bc -l)"
  done
done
