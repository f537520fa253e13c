# silu.sh - sourced by fused_vs_unfused.sh and layouts_agree.sh once they have set work, model
# and src, with the options after their positional arguments as "$@". A leading --silu is taken
# off: src becomes a copy of the model with every relu( replaced by silu( (model MODEL-silu), and
# spread becomes step_vs_float64.py's --ulp-spread, which fails unless that network's step is a
# smooth function of its weights. Why a real-size network needs it: step_vs_float64.py.
spread=
if [ "${1:-}" = --silu ]; then
  shift
  sed 's/\brelu(/silu(/g' "$src" > "$work/$model-silu.net"
  grep -q 'silu(' "$work/$model-silu.net"
  src="$work/$model-silu.net" model=$model-silu spread=--ulp-spread
fi
