# checks.sh - the shell tests' assertions, sourced by cli_test.sh, language_test.sh and lora_cli.sh:
#   check NAME STATUS COMMAND...   runs COMMAND, its output in $out; STATUS an exit status, or
#                                  `nonzero` for any failure that is not a crash (1 .. 69)
#   contains TEXT / lacks TEXT     $out has / has not TEXT
# Each counts into $passes or $fails and prints what failed; the test ends with their summary.
fails=0 passes=0
check() {
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$want" = nonzero ] && [ $rc -ne 0 ] && [ $rc -lt 70 ]; then passes=$((passes+1));
  elif [ "$want" = "$rc" ]; then passes=$((passes+1));
  else echo "FAIL $name: exit $rc, want $want"; echo "$out"; fails=$((fails+1)); fi
}
contains() { if grep -qF -- "$1" <<<"$out"; then passes=$((passes+1)); else echo "FAIL: output lacks '$1':"; echo "$out"; fails=$((fails+1)); fi; }
lacks() { if grep -qF -- "$1" <<<"$out"; then echo "FAIL: output has '$1':"; echo "$out"; fails=$((fails+1)); else passes=$((passes+1)); fi; }
