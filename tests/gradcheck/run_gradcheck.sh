#!/bin/sh
# run_gradcheck.sh NETC BUILD_DIR MODEL.net
#
# Compile MODEL.net into a trainer, write one batch of input data for it (make_data.py, from the
# model's `# data:` line) and run the trainer's --gradcheck: analytic gradients against central
# finite differences for up to 8 elements of each trainable parameter. The trainer's seed is 1
# unless the model has a `# seed: N` line. Exits with the trainer's status, and fails as well
# when the summary line `gradcheck: N checked, M failed` is missing or says nothing was checked.
set -u
if [ $# -ne 3 ]; then
  echo "usage: $0 NETC BUILD_DIR MODEL.net" >&2
  exit 2
fi
netc=$1 dir=$2 model=$3
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$model" .net)
mkdir -p "$dir" || exit 1

"$netc" "$model" -o "$dir/$name" || { echo "run_gradcheck: netc failed on $model" >&2; exit 1; }
data_args=$(/usr/bin/python3 "$here/make_data.py" "$model" "$dir/$name.data") ||
  { echo "run_gradcheck: make_data.py failed on $model" >&2; exit 1; }
seed=$(sed -n 's/^# *seed: *\([0-9][0-9]*\).*/\1/p' "$model" | head -n 1)

# data_args is one word per line (paths under BUILD_DIR hold no spaces in our builds)
# shellcheck disable=SC2086
out=$("$dir/$name" --gradcheck $data_args --seed "${seed:-1}" 2>&1)
rc=$?
printf '%s\n' "$out"
summary=$(printf '%s\n' "$out" | grep -E '^gradcheck: [0-9]+ checked, [0-9]+ failed' | tail -n 1)
if [ $rc -ne 0 ]; then
  echo "run_gradcheck: $name: the trainer exited with status $rc" >&2
  exit $rc
fi
if [ -z "$summary" ]; then
  echo "run_gradcheck: $name: no 'gradcheck: N checked, M failed' line" >&2
  exit 1
fi
checked=$(printf '%s\n' "$summary" | sed 's/^gradcheck: \([0-9]*\) checked, \([0-9]*\) failed.*/\1/')
failed=$(printf '%s\n' "$summary" | sed 's/^gradcheck: \([0-9]*\) checked, \([0-9]*\) failed.*/\2/')
if [ "$checked" -eq 0 ]; then
  echo "run_gradcheck: $name: nothing was checked" >&2
  exit 1
fi
if [ "$failed" -ne 0 ]; then
  echo "run_gradcheck: $name: $failed of $checked failed but the trainer exited 0" >&2
  exit 1
fi
exit 0
