#!/usr/bin/env bash
# Emit a trainer with the given optimizer, run its optimizer_step() and compare with torch.
#   run_optim.sh EMIT_OPTIM CC RUNTIME_DIR WORKDIR NAME sgd|adamw A B C D
set -euo pipefail
emit=$1 cc=$2 rt=$3 work=$4 name=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
"$emit" "$work/$name.c" "$@"
"$cc" -std=c11 -O2 -fopenmp -Wall -Wextra -Werror -I "$rt" -DGENERATED="\"$work/$name.c\"" \
  "$here/driver.c" -o "$work/$name" -lm
"$work/$name" > "$work/$name.txt"
/usr/bin/python3 "$here/check_optim.py" "$work/$name.txt" "$@"
