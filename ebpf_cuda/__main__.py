"""`python -m ebpf_cuda`: the ebpf-cuda command."""
from .cli import main

main()
