#!/usr/bin/env bash
# The trainer's LoRA options on bad input: options of a model without adapters, adapter
# directories whose configuration or tensors do not fit the model (every mismatch listed), an
# output that is an input, outputs in an evaluation; and that --init of a base model leaves the
# adapters to their initialisation while a file with adapters of another shape is refused; and
# the merge of a transposed layer (PEFT's fan_in_fan_out); the stock models' -D lora_r switches.
#   lora_cli.sh NETC WORKDIR
set -uo pipefail
netc=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/checks.sh"
mkdir -p "$work"
cd "$work" || exit 1

cat > tiny.net <<'EOF'
model tiny
const lora_r = 2
input x : f32[4, 6]
input y : i64[4]
h = relu(fc1: dense(x, 8))
logits = fc2: dense(h, 3)
train {
  loss = cross_entropy(logits, y)
  optimizer = adamw(1e-2)
  if lora_r > 0 {
    lora = lora(["fc1", "fc2"], r = lora_r, alpha = 4)
  }
}
EOF
"$netc" tiny.net -o lora >/dev/null && "$netc" tiny.net -D lora_r=0 -o base >/dev/null &&
  "$netc" tiny.net -D lora_r=3 -o lora3 >/dev/null || { echo "FAIL: netc tiny.net"; exit 1; }
/usr/bin/python3 - <<'EOF' || exit 1
import numpy as np
np.save("x.npy", np.random.default_rng(0).normal(size=(16, 6)).astype(np.float32))
np.save("y.npy", np.arange(16) % 3)
EOF
data=(--data x=x.npy --data y=y.npy)

check "base run" 0 ./base "${data[@]}" --steps 2 --save base.safetensors --quiet
check "adapters from their initialisation" 0 ./lora "${data[@]}" --steps 3 --init base.safetensors \
  --save all.safetensors --save-adapter ad --quiet
check "--adapter on a model without LoRA" 2 ./base "${data[@]}" --adapter ad
contains "--adapter: model 'tiny' has no LoRA adapters"
check "--save-adapter on a model without LoRA" 2 ./base "${data[@]}" --save-adapter ad2
contains "--save-adapter: model 'tiny' has no LoRA adapters"
check "--save-merged on a model without LoRA" 2 ./base "${data[@]}" --save-merged m.safetensors
check "--adapter with --resume" 2 ./lora "${data[@]}" --resume ck --adapter ad
contains "--resume and --adapter both set the adapters"
check "another rank" 1 ./lora3 "${data[@]}" --init base.safetensors --adapter ad --steps 1
contains "r is 2, but model 'tiny' has adapters of rank 3"
check "an output is an input" 2 ./lora "${data[@]}" --init base.safetensors --adapter ad --save-adapter ad --steps 1
contains "names the same file as --adapter"
check "--save-adapter in an evaluation" 2 ./lora --init base.safetensors --eval-only --eval-data x=x.npy \
  --eval-data y=y.npy --save-adapter ad3
contains "--eval-only trains nothing"
: > plain-file
check "--save-adapter names a file" 1 ./lora "${data[@]}" --save-adapter plain-file --steps 1
contains "cannot save the adapters to 'plain-file': it is not a directory"
check "evaluation with adapters" 0 ./lora --init base.safetensors --adapter ad --eval-only --eval-data x=x.npy \
  --eval-data y=y.npy --quiet

# an adapter file missing a tensor and holding a base weight: both listed, nothing loaded
mkdir -p bad && cp ad/adapter_config.json bad/
/usr/bin/python3 - <<'EOF' || exit 1
import json, struct
def tensors(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
h, data = tensors("ad/adapter_model.safetensors")
h.pop("__metadata__")
h.pop("base_model.model.fc2.lora_B.weight")
b, bdata = tensors("base.safetensors")
w = b["fc1.weight"]
h["base_model.model.fc1.weight"] = {"dtype": "F32", "shape": w["shape"],
                                    "data_offsets": [len(data), len(data) + w["data_offsets"][1] - w["data_offsets"][0]]}
data += bdata[w["data_offsets"][0]:w["data_offsets"][1]]
text = json.dumps(h).encode(); text += b" " * (-len(text) % 8)
open("bad/adapter_model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + data)
c = json.load(open("ad/adapter_config.json")); c["target_modules"] = ["fc1"]
json.dump(c, open("targets.json", "w"))
EOF
check "adapter file mismatches" 1 ./lora "${data[@]}" --init base.safetensors --adapter bad --steps 1
contains "2 mismatches"
contains "tensor 'base_model.model.fc1.weight' [8, 6] is not one of model 'tiny''s LoRA adapters"
contains "missing tensor 'base_model.model.fc2.lora_B.weight' [3, 2]"
mkdir -p targets && cp ad/adapter_model.safetensors targets/ && cp targets.json targets/adapter_config.json
check "other target_modules" 1 ./lora "${data[@]}" --init base.safetensors --adapter targets --steps 1
contains "target_modules differ from model 'tiny''s [\"fc1\", \"fc2\"]"

# --init of the full LoRA file restores the adapters; --init of a base file does not need them
check "--init of a LoRA model's --save" 0 ./lora "${data[@]}" --init all.safetensors --steps 1 --quiet
check "--init of the base into a model of another rank" 0 ./lora3 "${data[@]}" --init base.safetensors --steps 1 --quiet
check "--init of a file with adapters of another rank" 1 ./lora3 "${data[@]}" --init all.safetensors --steps 1
contains "tensor 'fc1.lora_A.weight' has shape [2, 6] but the model's parameter is [3, 6]"

# a transposed layer (GPT-2's Conv1D, [in, out]): PEFT's fan_in_fan_out, merged as W + (alpha/r) (B A)^T
sed -e 's/fc1: dense(x, 8)/fc1: dense(x, 8, transposed = true)/' tiny.net > tiny_t.net
"$netc" tiny_t.net -o lora_t >/dev/null || { echo "FAIL: netc tiny_t.net"; exit 1; }
check "transposed: train and merge" 0 ./lora_t "${data[@]}" --steps 3 --save all_t.safetensors \
  --save-merged merged_t.safetensors --save-adapter ad_t --quiet
check "transposed: fan_in_fan_out" 0 grep -q '"fan_in_fan_out":.*true' ad_t/adapter_config.json
check "transposed: merged weights" 0 /usr/bin/python3 -c '
import json, struct, sys
import numpy as np
def load(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__")
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).reshape(v["shape"])
            for k, v in h.items()}
p, m = load("all_t.safetensors"), load("merged_t.safetensors")
worst = 0.0
for layer, t in (("fc1", True), ("fc2", False)):
    ba = p[layer + ".lora_B.weight"].astype(np.float64) @ p[layer + ".lora_A.weight"].astype(np.float64)
    want = p[layer + ".weight"] + 4 / 2 * (ba.T if t else ba)
    worst = max(worst, float(np.max(np.abs(m[layer + ".weight"] - want) / (np.abs(want) + 1e-38))))
# rounded once from double: within half an ulp of float32
sys.exit(0 if sorted(m) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"] and worst <= 2 ** -24 else 1)'

# the stock models' LoRA switches: GPT-2 on c_attn (a Conv1D: fan_in_fan_out), BERT on query and value
/usr/bin/python3 -c '
import numpy as np
r = np.random.default_rng(1)
t = r.integers(0, 64, (8, 9))
np.save("g_tokens.npy", t[:, :-1]); np.save("g_targets.npy", t[:, 1:])
np.save("b_ids.npy", r.integers(0, 64, (8, 8))); np.save("b_types.npy", np.zeros((8, 8), np.int64))
np.save("b_mask.npy", np.ones((8, 8), np.int64)); np.save("b_labels.npy", np.where(r.random((8, 8)) < 0.3, 5, -100))' ||
  { echo "FAIL: model data"; exit 1; }
"$netc" "$root/models/gpt2.net" -o gpt2_lora -D vocab=64 -D seq=8 -D n_layer=2 -D n_head=2 -D n_embd=16 -D batch=2 \
  -D lora_r=2 >/dev/null && "$netc" "$root/models/bert.net" -o bert_lora -D vocab=64 -D seq=8 -D n_layer=2 -D n_head=2 \
  -D hidden=16 -D intermediate=32 -D batch=2 -D lora_r=2 >/dev/null || { echo "FAIL: netc models with lora_r"; exit 1; }
check "gpt2 -D lora_r" 0 ./gpt2_lora --data tokens=g_tokens.npy --data targets=g_targets.npy --steps 2 --save-adapter g_ad --quiet
check "gpt2: c_attn adapted" 0 grep -q '"fan_in_fan_out":.*true' g_ad/adapter_config.json
check "gpt2: the adapters" 0 ./gpt2_lora --list-params
contains "transformer.h.1.attn.c_attn.lora_B.weight [48, 2]"
lacks "c_proj.lora_A"
check "bert -D lora_r" 0 ./bert_lora --data input_ids=b_ids.npy --data token_type_ids=b_types.npy \
  --data attention_mask=b_mask.npy --data labels=b_labels.npy --steps 2 --save-adapter b_ad --quiet
check "bert: the adapters" 0 ./bert_lora --list-params
contains "bert.encoder.layer.1.attention.self.query.lora_A.weight [2, 16]"
contains "bert.encoder.layer.1.attention.self.value.lora_B.weight [16, 2]"
lacks "self.key.lora_A"

echo "lora_cli: $passes passed, $fails failed"
[ $fails -eq 0 ]
