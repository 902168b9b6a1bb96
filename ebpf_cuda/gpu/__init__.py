"""The GPU's own state beside the calls: NVML read through ctypes (`nvml.py`), the Xid
catalogue (`xid.py`), the sample and event records (`records.py`) and the threads that take
them (`sampler.py`)."""
