"""The `ebpf-cuda` command: a thin face on the public API."""
