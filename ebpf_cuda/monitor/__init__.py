"""`ebpf-cuda monitor`: the always-on agent, its metrics and their exporters."""
