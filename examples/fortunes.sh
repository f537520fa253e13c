#!/usr/bin/env bash
# The text files of Debian's `fortunes` package, one per line, installing it first when it is
# missing (examples/apt_install.sh): the corpus of the language-model examples.
#   examples/fortunes.sh NAME        NAME: the caller, for its messages
set -euo pipefail
who=${1:-fortunes}
fortunes=/usr/share/games/fortunes
if ! ls "$fortunes"/*.dat >/dev/null 2>&1; then
  "$(dirname "$0")/apt_install.sh" "$who" "the corpus" fortunes fortunes-min
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
