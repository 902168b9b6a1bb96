# Sourced by scripts/kernels.sh and scripts/arm64_root.sh: an apt configuration of its own
# for one Debian suite and architecture, in a folder (its sources list, package lists,
# status and downloads), so that packages of bullseye or of arm64 can be looked up and
# downloaded without changing the system's apt sources or architectures.
#
#   private_apt_setup DIR SUITE ARCH     then: apt-get "${private_apt_opts[@]}" update|download
private_apt_setup() {
    local dir="$1" suite="$2" arch="$3" keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    mkdir -p "$dir/lists/partial" "$dir/archives/partial"
    [ -e "$dir/status" ] || : > "$dir/status"
    local mirror="${EBPF_CUDA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    local security="${EBPF_CUDA_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
    {
        echo "deb [signed-by=$keyring] $mirror $suite main"
        echo "deb [signed-by=$keyring] $mirror $suite-updates main"
        echo "deb [signed-by=$keyring] $security $suite-security main"
    } > "$dir/sources.list"
    private_apt_opts=(-o "Dir::Etc::SourceList=$dir/sources.list"
                      -o "Dir::Etc::SourceParts=/dev/null"
                      -o "Dir::State::Lists=$dir/lists" -o "Dir::State::status=$dir/status"
                      -o "Dir::Cache=$dir" -o "Dir::Cache::archives=$dir/archives"
                      -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
                      -o "Acquire::Languages=none" -o "APT::Sandbox::User=root")
}
