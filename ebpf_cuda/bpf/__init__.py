"""The kernel's BPF objects: maps, programs, the ring buffer, uprobes, tracepoints, BTF and
feature probes."""
