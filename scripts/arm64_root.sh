#!/usr/bin/env bash
# The arm64 userland the arm64 guests of scripts/kernels.sh run on: Debian 12's arm64
# packages (python3 with pyelftools, click and pytest, a shell and the usual tools, gcc and
# g++ for the tests' stand-in libraries, a static busybox for the initramfs) and NVIDIA's
# aarch64 wheel of nvidia-cuda-runtime-cu12 (the real arm64 libcudart.so.12 for the quick
# start: `pip download --platform manylinux2014_aarch64`, unzipped), downloaded
# through a private apt configuration (scripts/private_apt.sh: the system's apt sources are
# not changed) and unpacked with `dpkg -x` (no maintainer scripts run: what they would make,
# the few files below do). Made once, in CACHE/arm64-root; prints its path.
#
#   scripts/arm64_root.sh [CACHE]      (default $EBPF_CUDA_KERNELS or /var/cache/ebpf-cuda-kernels)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:-${EBPF_CUDA_KERNELS:-/var/cache/ebpf-cuda-kernels}}"
root="$cache/arm64-root"
packages=(python3 python3-pyelftools python3-click python3-pytest busybox-static bash dash
          coreutils grep sed gawk util-linux mount procps findutils diffutils file gcc g++
          libc6-dev binutils base-files base-passwd)
stamp="${packages[*]} v2"
if [ "$(cat "$root/.ebpf-cuda-root" 2>/dev/null)" = "$stamp" ]; then
    echo "$root"
    exit 0
fi
# shellcheck source=private_apt.sh
. "$here/private_apt.sh"
apt_dir="$cache/apt/bookworm-arm64"
private_apt_setup "$apt_dir" bookworm arm64
export DEBIAN_FRONTEND=noninteractive
apt-get -qq "${private_apt_opts[@]}" update >&2
# (an empty status: every dependency is downloaded; the lock is this folder's own)
apt-get -qq "${private_apt_opts[@]}" -o Debug::NoLocking=1 install --download-only -y \
    --no-install-recommends "${packages[@]}" >&2
rm -rf "$root.part"
mkdir -p "$root.part"
for deb in "$apt_dir"/archives/*.deb; do
    dpkg -x "$deb" "$root.part"
done
cd "$root.part"
mkdir -p proc sys dev tmp run var/tmp root etc usr/local/bin
[ -e bin/sh ] || ln -s dash bin/sh
[ -e usr/bin/cc ] || ln -s gcc usr/bin/cc
[ -e usr/bin/c++ ] || ln -s g++ usr/bin/c++
[ -e usr/bin/awk ] || ln -s gawk usr/bin/awk
cp usr/share/base-passwd/passwd.master etc/passwd
cp usr/share/base-passwd/group.master etc/group
# (ldconfig's cache is made in the guest, at the first boot's need: ld.so's default paths
# already hold Debian's multiarch folders)
printf '/usr/local/lib\n/lib/aarch64-linux-gnu\n/usr/lib/aarch64-linux-gnu\n' > etc/ld.so.conf
# `ebpf-cuda` as the console script would be (the checkout is on PYTHONPATH in the guest)
printf '#!/bin/sh\nexec python3 -m ebpf_cuda "$@"\n' > usr/local/bin/ebpf-cuda
chmod 755 usr/local/bin/ebpf-cuda
# NVIDIA's arm64 runtime (the host's version where it has one), as pip would install it
wheels="$cache/wheels-arm64"
mkdir -p "$wheels"
cudart=nvidia-cuda-runtime-cu12
version="$(python3 -m pip show "$cudart" 2>/dev/null | awk '/^Version:/ {print $2}')"
python3 -m pip download -q --no-deps --platform manylinux2014_aarch64 --only-binary=:all: \
    -d "$wheels" "$cudart${version:+==$version}" >&2 \
    || echo "$0: no aarch64 wheel of $cudart: the quick start finds no libcudart" >&2
site=usr/local/lib/python3.11/dist-packages
mkdir -p "$site"
for wheel in "$wheels"/nvidia_cuda_runtime_cu12-"${version:-}"*aarch64*.whl; do
    [ -f "$wheel" ] && python3 -m zipfile -e "$wheel" "$site"
done
echo "$stamp" > .ebpf-cuda-root
cd /
rm -rf "$root"
mv "$root.part" "$root"
echo "$root"
