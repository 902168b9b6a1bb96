"""What to trace: the files, symbols, processes and containers the probes go on."""
