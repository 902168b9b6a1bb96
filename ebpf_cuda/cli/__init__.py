"""The `ebpf-cuda` command: a thin face on the public API. main.py is the entry point; trace.py,
report.py and monitor.py the commands; signals.py their stop signals; common.py what they share."""
