"""The stand-in NVML for the GPU-state tests: tests/native/fakenvml.c built as
`libnvidia-ml.so.1` (its header comment is the script language), and scripts written for it.

`build_fake_nvml(cc)` → the library's folder; `build_fake_nvml(cc, "OMIT_GPM")` a variant
without those functions (an older driver). `script(path, text)` writes a script; the library
reads the file named by FAKENVML_SCRIPT at nvmlInit_v2.
"""
from pathlib import Path

SONAME = "libnvidia-ml.so.1"
H100 = "NVIDIA-H100-80GB-HBM3"  # (the script's words have no spaces)
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"

# Two devices, the second with every value different, GPM and NVLink on the first only.
DEVICES = (
    "dev 0 name=%s uuid=%s gpu=75 mem=30 total=85899345920 used=21474836480 power=350000 "
    "temp=61 sm_clock=1980 mem_clock=2619 reasons=0x4 pcie_tx=1200 pcie_rx=3400 ecc_sbe=2 "
    "ecc_dbe=0 gpm=1 gr_active=81 sm_active=64 occupancy=37 tensor=22 dram=48 "
    "nvlink_tx=25000000 nvlink_rx=12000000\n" % (H100, UUID0)
    + "dev 1 name=%s uuid=%s gpu=5 mem=1 total=85899345920 used=1073741824 power=90000 "
    "temp=40 sm_clock=345 mem_clock=2619 reasons=0x1 pcie_tx=0 pcie_rx=0 ecc_sbe=0 ecc_dbe=1 "
    "gpm=0 mig=1\n" % (H100, UUID1))


def build_fake_nvml(cc, *omit: str) -> Path:
    """The folder holding the stand-in `libnvidia-ml.so.1` (built once per variant)."""
    suffix = "-".join(omit).lower()
    folder = Path(cc.outdir) / ("nvml-" + suffix if suffix else "nvml")
    folder.mkdir(exist_ok=True)
    cc.shared("fakenvml.c", "%s/%s" % (folder.name, SONAME),
              extra=["-Wl,-soname," + SONAME] + ["-D" + name for name in omit])
    return folder


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
