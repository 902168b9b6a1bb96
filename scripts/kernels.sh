#!/usr/bin/env bash
# Run a command as root under one of Debian's kernels, booted in QEMU (TCG) on this machine's
# own filesystem (shared read-only, with a throwaway overlay); exit with the command's status.
#
#   scripts/kernels.sh 6.1 -- ebpf-cuda -- python3 examples/cuda_calls.py
#   scripts/kernels.sh 6.12 -- 'python3 -m pytest -q -m kernel tests'
#   scripts/kernels.sh 6.1.0-57-amd64 -- uname -r      (an exact package version)
#   scripts/kernels.sh --list                          (the versions apt knows)
#
# VERSION: 6.1 (Debian 12's linux-image-6.1.0-*-amd64, the newest) or 6.12
# (linux-image-6.12.*+deb12-amd64, the newest), or an exact suffix of linux-image-*.
# The package is fetched with `apt-get download` and unpacked with `dpkg -x` into
# $EBPF_CUDA_KERNELS (default /var/cache/ebpf-cuda-kernels), once. Needs root (QEMU exports
# / as root), qemu-system-x86 and busybox-static (installed with apt-get when missing).
# Options before VERSION go to scripts/kernel_vm.py: --timeout S, --boot-timeout S,
# --attempts N, --cpus N, --memory M, --console FILE, --times FILE, --env NAME=VALUE.
# /dev/kvm is not used: on these hosts it is a paravirtual KVM that crashes stock kernels.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${EBPF_CUDA_KERNELS:-/var/cache/ebpf-cuda-kernels}"
export DEBIAN_FRONTEND=noninteractive

vm_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        --list) apt-cache search --names-only '^linux-image-6\.(1\.0-[0-9]+|12\.[0-9]+\+deb12)-amd64$' \
                    | cut -d' ' -f1 | sort -V; exit 0 ;;
        --timeout|--boot-timeout|--attempts|--cpus|--memory|--console|--times|--env|--append)
            vm_opts+=("$1" "$2"); shift 2 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
done
if [ $# -lt 3 ] || [ "$2" != "--" ]; then
    echo "usage: $0 [OPTIONS] VERSION -- CMD..." >&2
    exit 2
fi
version="$1"
shift 2

apt_updated=
need() {  # need COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
    apt-get install -y -qq --no-install-recommends "$2" >/dev/null
}
need qemu-system-x86_64 qemu-system-x86
[ -x /bin/busybox ] && ! grep -q ld-linux /bin/busybox 2>/dev/null || {
    if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
    apt-get install -y -qq --no-install-recommends busybox-static >/dev/null
}

package_for() {  # the linux-image package name for VERSION
    local pattern
    case "$1" in
        6.1) pattern='^linux-image-6\.1\.0-[0-9]+-amd64$' ;;
        6.12) pattern='^linux-image-6\.12\.[0-9]+\+deb12-amd64$' ;;
        *) pattern="^linux-image-$(printf '%s' "$1" | sed 's/[.+]/\\&/g')\$" ;;
    esac
    apt-cache search --names-only "$pattern" | cut -d' ' -f1 | sort -V | tail -n 1
}

package="$(package_for "$version")"
if [ -z "$package" ] && [ -z "$apt_updated" ]; then
    apt-get update -qq; apt_updated=1
    package="$(package_for "$version")"
fi
if [ -z "$package" ]; then
    echo "$0: apt knows no kernel package for $version (try --list)" >&2
    exit 2
fi
release="${package#linux-image-}"
dir="$cache/$release"
if [ ! -d "$dir/lib/modules/$release" ]; then
    mkdir -p "$cache"
    tmp="$(mktemp -d "$cache/.download.XXXXXX")"
    (cd "$tmp" && apt-get download -qq "$package")
    rm -rf "$dir.part"
    dpkg -x "$tmp"/"$package"_*.deb "$dir.part"
    rm -rf "$tmp"
    mv "$dir.part" "$dir"
fi
exec python3 "$here/kernel_vm.py" "${vm_opts[@]+"${vm_opts[@]}"}" "$dir" -- "$@"
