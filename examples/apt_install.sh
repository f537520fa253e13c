#!/usr/bin/env bash
# Install a Debian package with apt, as root or through sudo, for an example that needs its
# files: the first of PACKAGE and its FALLBACKs that installs. Messages go to stderr.
#   examples/apt_install.sh WHO WHAT PACKAGE [FALLBACK...]     WHO: the caller; WHAT: what it is for
set -euo pipefail
who=$1 what=$2
shift 2
echo "$who: installing Debian's $1 ($what)" >&2
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq >&2
for package in "$@"; do
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$package" >/dev/null && exit 0
done
exit 1
