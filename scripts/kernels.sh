#!/usr/bin/env bash
# Run a command as root under one of Debian's kernels, booted in QEMU (TCG) on this machine's
# own filesystem (shared read-only, with a throwaway overlay); exit with the command's status.
#
#   scripts/kernels.sh 6.1 -- ebpf-cuda -- python3 examples/cuda_calls.py
#   scripts/kernels.sh 5.10 -- uname -r                (Debian 11's kernel, from bullseye)
#   scripts/kernels.sh 6.12 -- 'python3 -m pytest -q -m kernel tests'
#   scripts/kernels.sh 6.1.0-57-amd64 -- uname -r      (an exact package version)
#   scripts/kernels.sh --list                          (the versions apt knows)
#   scripts/kernels.sh --fetch 6.12                    (download and unpack only)
#   scripts/kernels.sh --refresh 6.12 -- CMD           (ask apt for a newer package first)
#   scripts/kernels.sh --arch arm64 6.12 -- CMD         (Debian's arm64 kernel, emulated)
#
# VERSION: 6.1 (Debian 12's linux-image-6.1.0-*-amd64, the newest), 6.12
# (linux-image-6.12.*+deb12-amd64, the newest), 5.10 (Debian 11's linux-image-5.10.0-*-amd64,
# the newest in bullseye and bullseye-security), or an exact suffix of linux-image-*.
# The package is fetched with `apt-get download` and unpacked with `dpkg -x` into
# $EBPF_CUDA_KERNELS (default /var/cache/ebpf-cuda-kernels), once. Bookworm's kernels come
# through the system's apt; 5.10 through a private apt configuration under
# $EBPF_CUDA_KERNELS/apt/bullseye-amd64 (its own sources list, package lists and status: the
# system's apt sources are not changed), as arm64's (apt/SUITE-arm64). --arch arm64: Debian's
# linux-image-*-arm64 in qemu-system-aarch64 (qemu-system-arm) on an arm64 userland that
# scripts/arm64_root.sh unpacks from Debian's arm64 packages (cached beside the kernels);
# the checkout is shared into it at its own path. A kernel found in the cache is
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
arch=amd64
list=
while [ $# -gt 0 ]; do
    case "$1" in
        --list) list=1; shift ;;
        --arch) case "$2" in
                    amd64|x86_64|x86-64) arch=amd64 ;;
                    arm64|aarch64) arch=arm64 ;;
                    *) echo "$0: --arch: amd64 or arm64, not $2" >&2; exit 2 ;;
                esac
                shift 2 ;;
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
if [ -z "$list" ] && { [ $# -lt 3 ] || [ "$2" != "--" ]; }; then
    echo "usage: $0 [--arch amd64|arm64] [OPTIONS] VERSION -- CMD..." >&2
    exit 2
fi
version="${1:-}"
[ -z "$list" ] && shift 2

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

# Where the kernel package comes from: the system's apt (bookworm, amd64), or a private apt
# configuration for another suite or architecture (scripts/private_apt.sh).
suite=bookworm
case "$version" in 5.10|5.10.*) suite=bullseye ;; esac
kapt=()  # (empty: the system's apt)
if [ "$suite" != bookworm ] || [ "$arch" != amd64 ]; then
    # shellcheck source=private_apt.sh
    . "$here/private_apt.sh"
    private_apt_setup "$cache/apt/$suite-$arch" "$suite" "$arch"
    kapt=("${private_apt_opts[@]}")
fi
kapt_updated=
kapt_update() {  # the package lists the kernel is looked up in
    [ -n "$kapt_updated" ] && return 0
    if [ "${#kapt[@]}" -eq 0 ]; then apt_update; else apt_retry "${kapt[@]}" update; fi
    kapt_updated=1
}
if [ "${#kapt[@]}" -gt 0 ] && [ -z "$(ls "$cache/apt/$suite-$arch/lists" 2>/dev/null \
                                       | grep Packages)" ]; then
    kapt_update || true  # (the private lists start empty)
fi

pattern_for() {  # the linux-image package names VERSION stands for
    case "$1" in
        6.1) echo "^linux-image-6\\.1\\.0-[0-9]+-$arch\$" ;;
        6.12) echo "^linux-image-6\\.12\\.[0-9]+\\+deb12-$arch\$" ;;
        5.10) echo "^linux-image-5\\.10\\.0-[0-9]+-$arch\$" ;;
        *) echo "^linux-image-$(printf '%s' "$1" | sed 's/[.+]/\\&/g')\$" ;;
    esac
}
if [ -n "$list" ]; then
    for v in ${version:-6.1 6.12}; do
        apt-cache "${kapt[@]+"${kapt[@]}"}" search --names-only "$(pattern_for "$v")" \
            | cut -d' ' -f1 | sort -V
    done
    exit 0
fi

if [ "$arch" = arm64 ]; then
    qemu_bin=qemu-system-aarch64 qemu_package=qemu-system-arm
else
    qemu_bin=qemu-system-x86_64 qemu_package=qemu-system-x86
fi
command -v "$qemu_bin" >/dev/null 2>&1 || {
    apt_update; apt_retry install -y --no-install-recommends "$qemu_package" >/dev/null
}
if [ "$arch" = amd64 ]; then
    python3 "$here/kernel_vm.py" --has-static-busybox || {
        apt_update; apt_retry install -y --no-install-recommends busybox-static >/dev/null
    }
fi

package_for() {  # the linux-image package name for VERSION
    # (apt-cache fails while another apt rebuilds its cache: then the kernel cache decides)
    { apt-cache "${kapt[@]+"${kapt[@]}"}" search --names-only "$(pattern_for "$1")" \
          2>/dev/null || true; } | cut -d' ' -f1 | sort -V | tail -n 1
}

cached_for() {  # the newest kernel already unpacked (completely) in the cache for VERSION
    local name
    for name in $(ls "$cache" 2>/dev/null | sort -V); do
        [ -d "$cache/$name/lib/modules/$name" ] || continue  # (.part: an unpacking cut off)
        case "$1:$name" in
            6.1:6.1.0-*-"$arch"|6.12:6.12.*+deb12-"$arch"|5.10:5.10.0-*-"$arch"|"$1:$1")
                echo "linux-image-$name" ;;
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
    kapt_update || true  # (offline: what was fetched before may still do, below)
    package="$(package_for "$version")"
fi
if [ -z "$package" ]; then
    package="$(cached_for "$version")"  # (--refresh, apt offline: what was fetched before)
fi
if [ -z "$package" ]; then
    echo "$0: apt knows no kernel package for $version ($arch; try --list)" >&2
    exit 2
fi
release="${package#linux-image-}"
dir="$cache/$release"
if [ ! -d "$dir/lib/modules/$release" ]; then
    mkdir -p "$cache"
    tmp="$(mktemp -d "$cache/.download.XXXXXX")"
    trap 'rm -rf "$tmp" "$dir.part"' EXIT
    # (stale package lists name a file the mirror no longer has: update them once, retry)
    (cd "$tmp" && apt_retry "${kapt[@]+"${kapt[@]}"}" download "$package") \
        || { kapt_updated=; kapt_update
             (cd "$tmp" && apt_retry "${kapt[@]+"${kapt[@]}"}" download "$package"); }
    rm -rf "$dir.part"
    dpkg -x "$tmp"/"$package"_*.deb "$dir.part"
    rm -rf "$tmp"
    mv "$dir.part" "$dir"
    trap - EXIT
fi
if [ "$arch" = arm64 ]; then
    # The arm64 userland the guest runs on (its static busybox boots it).
    root="$("$here/arm64_root.sh" "$cache")"
    vm_opts+=(--arch arm64 --root "$root" --env "PYTHONPATH=$PWD")
fi
if [ -n "$fetch_only" ]; then
    echo "$dir"
    exit 0
fi
exec python3 "$here/kernel_vm.py" "${vm_opts[@]+"${vm_opts[@]}"}" "$dir" -- "$@"
