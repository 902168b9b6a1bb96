"""The BPF programs this tool generates (assembled with asm/), one module per program family."""
