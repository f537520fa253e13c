#!/usr/bin/env bash
# The text files of Debian's `fortunes` package, one per line, installing it first when it is
# missing: the corpus of examples/tiny_gpt.sh and examples/tiny_llama.sh.
#   examples/fortunes.sh NAME        NAME: the caller, for its messages
set -euo pipefail
who=${1:-fortunes}
fortunes=/usr/share/games/fortunes
if ! ls "$fortunes"/*.dat >/dev/null 2>&1; then
  echo "$who: installing Debian's fortunes (the corpus)" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends fortunes >/dev/null ||
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends fortunes-min >/dev/null
fi
# every fortune file: the text beside its .dat index (not the index, not the offensive ones in off/)
found=0
for dat in "$fortunes"/*.dat; do
  if [ -f "${dat%.dat}" ]; then
    echo "${dat%.dat}"
    found=1
  fi
done
((found)) || { echo "$who: no fortune files in $fortunes; give text files as arguments" >&2; exit 1; }
