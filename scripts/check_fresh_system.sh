#!/usr/bin/env bash
# Proves that the README's commands need nothing installed by hand: makes a bare Debian 12
# (bookworm, debootstrap's minbase variant: essential packages and apt only) in a folder,
# copies this checkout's tracked files into it, and runs there, as root in a chroot,
#   scripts/train.sh --epochs 1          (setup.sh installs everything; the Serial trainer)
#   scripts/check_plots.sh               (that trainer's --metrics drawn by plot_metrics.py:
#                                         setup.sh's python3-matplotlib is enough)
#   scripts/test.sh, sanitize half       (KAT_BACKENDS=sanitize: the Serial configuration under
#                                         ASan+UBSan, every test it runs anywhere)
# and checks that the default build kept oneDNN (an optional dependency whose own needs
# setup.sh must install: without them KAT configures without it, which would pass unnoticed).
#
# Cached between runs in $KAT_DEPS_DIR/fresh-system (default ~/.cache/kat): debootstrap's
# tarball of the base packages (--make-tarball / --unpack-tarball) and the .deb files apt
# downloads inside. The system itself is made anew from the tarball every run.
#   KAT_FRESH_KEEP=1     keep the system's folder afterwards (for a look inside)
#   KAT_FRESH_WITHOUT=P  remove package P from setup.sh's list inside the copy, to watch this
#                        check fail when a package is missing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
[ "$(id -u)" -eq 0 ] || { echo "check_fresh_system.sh: needs root (debootstrap, chroot)" >&2; exit 1; }

suite=bookworm
cache=${KAT_DEPS_DIR:-$HOME/.cache/kat}/fresh-system
mkdir -p "$cache/archives/partial"
[ -n "$(kat_missing debootstrap)" ] && kat_apt_install -- debootstrap

# The mirror this machine's apt already uses for the suite (no host name written here).
mirror=$(awk -v suite="$suite" '
  /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; ++i) if ($i == suite) { print uri; exit } }
  ' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2; exit }' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "check_fresh_system.sh: no apt source for $suite on this machine" >&2; exit 1; }

tarball=$cache/$suite-minbase.tgz
if [ ! -f "$tarball" ]; then
  echo "== debootstrap: downloading $suite's base packages into $tarball"
  scratch=$(mktemp -d "$cache/make-tarball.XXXXXX")
  debootstrap --variant=minbase --make-tarball="$tarball.partial" "$suite" "$scratch" "$mirror" \
    >"$cache/make-tarball.log" 2>&1 || { tail -20 "$cache/make-tarball.log" >&2; exit 1; }
  rm -rf "$scratch"
  mv "$tarball.partial" "$tarball"
fi

target=$(mktemp -d /var/tmp/kat-fresh-XXXXXX)
mounts=()
cleanup() {
  local i p
  # Whatever still runs inside the system (an interrupted build) goes first: its files are
  # about to be removed.
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$target" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 1
  for ((i = ${#mounts[@]} - 1; i >= 0; --i)); do
    umount -R "${mounts[i]}" 2>/dev/null || umount -lR "${mounts[i]}" 2>/dev/null || true
  done
  if [ "${KAT_FRESH_KEEP:-0}" = 1 ]; then
    echo "check_fresh_system.sh: kept $target"
  else
    # Never follow a mount that failed to go away.
    if ! grep -q " $target" /proc/mounts; then rm -rf "$target"; fi
    return 0
  fi
}
trap cleanup EXIT
trap "exit 1" INT TERM

start=$SECONDS
echo "== debootstrap: a bare $suite in $target"
debootstrap --variant=minbase --unpack-tarball="$tarball" "$suite" "$target" "$mirror" \
  >"$cache/debootstrap.log" 2>&1 || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
echo "   $((SECONDS - start)) s; $(chroot "$target" dpkg-query -W -f='.\n' | wc -l) packages installed"

# What a fresh machine has besides: the same apt sources as this one, a resolver, the kernel's
# file systems. apt's downloads land in the cache (a bind mount), not in the system.
rm -f "$target/etc/apt/sources.list"
cp /etc/apt/sources.list.d/*.sources "$target/etc/apt/sources.list.d/" 2>/dev/null ||
  echo "deb $mirror $suite main" >"$target/etc/apt/sources.list"
cp -L /etc/resolv.conf "$target/etc/resolv.conf"
mkdir -p "$target/var/cache/apt/archives"
for m in proc sys dev; do
  mount --rbind "/$m" "$target/$m"
  mount --make-rslave "$target/$m"
  mounts+=("$target/$m")
done
mount --bind "$cache/archives" "$target/var/cache/apt/archives"
mounts+=("$target/var/cache/apt/archives")
# apt downloads as its own user, as on an installed system (else it warns and downloads as root).
chroot "$target" chown _apt:root /var/lib/apt/lists/partial /var/cache/apt/archives/partial

# The checkout's tracked files (CI's clean clone: the same thing).
mkdir -p "$target/root/kat"
(cd "$root" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$target/root/kat"
if [ -n "${KAT_FRESH_WITHOUT:-}" ]; then
  echo "== taking '$KAT_FRESH_WITHOUT' out of setup.sh's packages (KAT_FRESH_WITHOUT)"
  sed -i -E "s/(^|[[:space:]])${KAT_FRESH_WITHOUT}([[:space:]]|$)/\1\2/" "$target/root/kat/scripts/setup.sh"
fi

in_system() {
  chroot "$target" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb bash -c "cd /root/kat && $1"
}

t=$SECONDS
echo "== fresh system: scripts/train.sh --epochs 1"
in_system "scripts/train.sh --epochs 1 --progress never"
echo "   $((SECONDS - t)) s"
grep -q '^KAT_ENABLE_ONEDNN:BOOL=ON$' "$target/root/kat/build/serial/CMakeCache.txt" || {
  echo "check_fresh_system.sh: the default build configured without oneDNN:" >&2
  grep -i 'onednn' "$target/root/kat/build/serial/CMakeCache.txt" >&2 || true
  exit 1
}

t=$SECONDS
echo "== fresh system: scripts/check_plots.sh build/serial/examples/kat_train"
in_system "scripts/check_plots.sh build/serial/examples/kat_train"
echo "   $((SECONDS - t)) s"

t=$SECONDS
# The README's test command is two configurations; its sanitize half runs here, on the bare
# system, rather than on the host (.ci/run runs the OpenMP half there). Building the test suite
# once more, as the -O3 Serial subset this check ran before, took 969 of its 1513 s
# (2026-11-27, AMD EPYC Zen 4, 2 cores) and tested nothing the sanitize half does not.
echo "== fresh system: KAT_BACKENDS=sanitize scripts/test.sh"
in_system "KAT_BACKENDS=sanitize scripts/test.sh"
echo "   $((SECONDS - t)) s"
echo "== fresh system: passed in $((SECONDS - start)) s"
