#!/usr/bin/env bash
# Fetch oneDNN 3.2 (Intel's build for GNU OpenMP, from its PyPI wheels) into DIR: DIR/include and
# DIR/lib/libdnnl.so.3. scripts/setup.sh builds netc against it when this succeeds and against
# Debian's oneDNN 2.6 (libdnnl-dev) otherwise: 3.2's AVX2 convolutions are brgemm kernels, about
# 1.3-1.5x the speed of 2.6's on an AVX2 CPU (docs/trainer.md, "Convolutions on the CPU").
#   scripts/fetch_onednn.sh DIR     exit 0 when DIR holds oneDNN 3.2 (fetched now or before)
# The wheels are pinned by version and hash; nothing is installed into any Python.
set -euo pipefail
dest=${1:?usage: scripts/fetch_onednn.sh DIR}
if [ -f "$dest/lib/libdnnl.so.3" ] && [ -f "$dest/include/oneapi/dnnl/dnnl.h" ]; then exit 0; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/requirements.txt" <<'EOF'
onednn-cpu-gomp==2023.2.0 --hash=sha256:2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb
onednn-devel-cpu-gomp==2023.2.0 --hash=sha256:9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284
EOF
python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes -r "$tmp/requirements.txt" \
  -d "$tmp/wheels"

# A wheel is a zip without symbolic links: keep one copy of the library, link its other names.
python3 - "$tmp/wheels" "$tmp/onednn" <<'EOF'
import os, sys, zipfile
wheels, out = sys.argv[1:]
for name in sorted(os.listdir(wheels)):
    with zipfile.ZipFile(os.path.join(wheels, name)) as z:
        for member in z.namelist():
            parts = member.split("/")
            if len(parts) < 4 or parts[1] != "data" or parts[2] not in ("include", "lib", "share"):
                continue
            rel = "/".join(parts[2:])
            if rel.startswith("lib/libdnnl.so") and rel != "lib/libdnnl.so.3":
                continue
            path = os.path.join(out, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(member) as src, open(path, "wb") as dst:
                dst.write(src.read())
os.symlink("libdnnl.so.3", os.path.join(out, "lib", "libdnnl.so"))
EOF
[ -f "$tmp/onednn/lib/libdnnl.so.3" ] && [ -f "$tmp/onednn/include/oneapi/dnnl/dnnl.h" ]
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$tmp/onednn" "$dest"
echo "fetch_onednn: oneDNN 3.2 in $dest"
