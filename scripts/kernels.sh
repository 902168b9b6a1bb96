#!/usr/bin/env bash
# Run a command as root under one of Debian's kernels, booted in QEMU (TCG) on this machine's
# own filesystem (shared read-only, with a throwaway overlay); exit with the command's status.
#
#   scripts/kernels.sh 6.1 -- ebpf-cuda -- python3 examples/cuda_calls.py
#   scripts/kernels.sh 6.12 -- 'python3 -m pytest -q -m kernel tests'
#   scripts/kernels.sh 6.1.0-57-amd64 -- uname -r      (an exact package version)
#   scripts/kernels.sh --list                          (the versions apt knows)
#   scripts/kernels.sh --fetch 6.12                    (download and unpack only)
#   scripts/kernels.sh --refresh 6.12 -- CMD           (ask apt for a newer package first)
#
# VERSION: 6.1 (Debian 12's linux-image-6.1.0-*-amd64, the newest) or 6.12
# (linux-image-6.12.*+deb12-amd64, the newest), or an exact suffix of linux-image-*.
# The package is fetched with `apt-get download` and unpacked with `dpkg -x` into
# $EBPF_CUDA_KERNELS (default /var/cache/ebpf-cuda-kernels), once: a kernel found there is
# used without apt or network (--refresh: apt is asked for a newer one). apt's locks, held
# by another apt, are waited for (~5 minutes), not failed on. Needs root (QEMU exports
# / as root), qemu-system-x86 and busybox-static (installed with apt-get when missing).
# Options before VERSION go to scripts/kernel_vm.py: --timeout S, --boot-timeout S,
# --attempts N, --cpus N, --memory M, --console FILE, --times FILE, --env NAME=VALUE.
# /dev/kvm is not used: on these hosts it is a paravirtual KVM that crashes stock kernels.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${EBPF_CUDA_KERNELS:-/var/cache/ebpf-cuda-kernels}"
export DEBIAN_FRONTEND=noninteractive

vm_opts=()
fetch_only=
refresh=
while [ $# -gt 0 ]; do
    case "$1" in
        --list) apt-cache search --names-only '^linux-image-6\.(1\.0-[0-9]+|12\.[0-9]+\+deb12)-amd64$' \
                    | cut -d' ' -f1 | sort -V; exit 0 ;;
        --timeout|--boot-timeout|--attempts|--cpus|--memory|--console|--times|--env|--append)
            vm_opts+=("$1" "$2"); shift 2 ;;
        --fetch) fetch_only=1; shift ;;
        --refresh) refresh=1; shift ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
done
if [ -n "$fetch_only" ] && [ $# -eq 1 ]; then
    set -- "$1" -- true
fi
if [ $# -lt 3 ] || [ "$2" != "--" ]; then
    echo "usage: $0 [OPTIONS] VERSION -- CMD..." >&2
    exit 2
fi
version="$1"
shift 2

retry_s="${EBPF_CUDA_APT_RETRY_S:-10}"
apt_retry() {  # apt-get ARGS...: waits out another apt's locks (up to ~5 minutes), not fails
    local try err status
    err="$(mktemp)"
    for try in $(seq 1 30); do
        # (DPkg::Lock::Timeout covers the dpkg lock only; update's lists lock fails at once)
        apt-get -qq -o DPkg::Lock::Timeout=300 "$@" 2>"$err" && { rm -f "$err"; return 0; }
        status=$?
        grep -qiE 'could not get lock|unable to lock|is another process using it' "$err" \
            || break
        echo "$0: apt is busy (another apt holds its lock): retrying in ${retry_s} s" >&2
        sleep "$retry_s"
    done
    cat "$err" >&2
    rm -f "$err"
    return "$status"
}
apt_updated=
apt_update() { [ -n "$apt_updated" ] || { apt_retry update; apt_updated=1; }; }
command -v qemu-system-x86_64 >/dev/null 2>&1 || {
    apt_update; apt_retry install -y --no-install-recommends qemu-system-x86 >/dev/null
}
python3 "$here/kernel_vm.py" --has-static-busybox || {
    apt_update; apt_retry install -y --no-install-recommends busybox-static >/dev/null
}

package_for() {  # the linux-image package name for VERSION
    local pattern
    case "$1" in
        6.1) pattern='^linux-image-6\.1\.0-[0-9]+-amd64$' ;;
        6.12) pattern='^linux-image-6\.12\.[0-9]+\+deb12-amd64$' ;;
        *) pattern="^linux-image-$(printf '%s' "$1" | sed 's/[.+]/\\&/g')\$" ;;
    esac
    # (apt-cache fails while another apt rebuilds its cache: then the kernel cache decides)
    { apt-cache search --names-only "$pattern" 2>/dev/null || true; } | cut -d' ' -f1 \
        | sort -V | tail -n 1
}

cached_for() {  # the newest kernel already unpacked (completely) in the cache for VERSION
    local name
    for name in $(ls "$cache" 2>/dev/null | sort -V); do
        [ -d "$cache/$name/lib/modules/$name" ] || continue  # (.part: an unpacking cut off)
        case "$1:$name" in
            6.1:6.1.0-*-amd64|6.12:6.12.*+deb12-amd64|"$1:$1") echo "linux-image-$name" ;;
        esac
    done | tail -n 1
}

# A kernel unpacked before is used as it is: no apt, no network (--refresh asks apt for a
# newer one).
package=
[ -n "$refresh" ] || package="$(cached_for "$version")"
if [ -z "$package" ]; then
    package="$(package_for "$version")"
fi
if [ -z "$package" ]; then
    apt_update || true  # (offline: what was fetched before may still do, below)
    package="$(package_for "$version")"
fi
if [ -z "$package" ]; then
    package="$(cached_for "$version")"  # (--refresh, apt offline: what was fetched before)
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
    trap 'rm -rf "$tmp" "$dir.part"' EXIT
    # (stale package lists name a file the mirror no longer has: update them once, retry)
    (cd "$tmp" && apt_retry download "$package") \
        || { apt_updated=; apt_update; (cd "$tmp" && apt_retry download "$package"); }
    rm -rf "$dir.part"
    dpkg -x "$tmp"/"$package"_*.deb "$dir.part"
    rm -rf "$tmp"
    mv "$dir.part" "$dir"
    trap - EXIT
fi
if [ -n "$fetch_only" ]; then
    echo "$dir"
    exit 0
fi
exec python3 "$here/kernel_vm.py" "${vm_opts[@]+"${vm_opts[@]}"}" "$dir" -- "$@"
