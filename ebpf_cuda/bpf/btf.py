"""The smallest BTF a map can need: an `int` key and a value of N bytes.

Task-local storage maps must name their key and value types in BTF. Two integer types and
an array type are enough (UAPI `linux/btf.h`: header, type section, string section).
"""
import struct

BTF_MAGIC = 0xEB9F
BTF_KIND_INT = 1
BTF_KIND_ARRAY = 3
BTF_INT_SIGNED = 1
INT_TYPE_ID = 1  # "int", the key of a task storage map
BYTES_TYPE_ID = 3  # "unsigned char[value_size]", its value

_HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, hdr_len, type/str off+len
_TYPE = struct.Struct("<III")  # name_off, info (kind << 24 | vlen), size or type


def key_and_bytes(value_size: int) -> bytes:
    """BTF with [1] int, [2] unsigned char, [3] unsigned char[value_size]."""
    strings = b"\0int\0unsigned char\0"
    types = (_TYPE.pack(1, BTF_KIND_INT << 24, 4) + struct.pack("<I", BTF_INT_SIGNED << 24 | 32)
             + _TYPE.pack(5, BTF_KIND_INT << 24, 1) + struct.pack("<I", 8)
             + _TYPE.pack(0, BTF_KIND_ARRAY << 24, 0) + struct.pack("<III", 2, INT_TYPE_ID,
                                                                    value_size))
    header = _HEADER.pack(BTF_MAGIC, 1, 0, _HEADER.size, 0, len(types), len(types),
                          len(strings))
    return header + types + strings
