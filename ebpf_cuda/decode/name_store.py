"""Where the kernel names a trace learns are kept: compressed, a few bytes a name.

A framework registers ~30,000 kernels a process (PyTorch's import), each a mangled name of a
few hundred bytes, and few are ever launched. As a dict of Python strings they cost ~430
bytes of tracer memory a registration (13 MB a PyTorch process, and ~8 MB of it the
allocator kept after the process went). Here a process's program (an image, names.py) keeps
its handles packed in one buffer and its names in zlib-compressed blocks of BLOCK bytes
(mangled names share long prefixes: ~10x smaller), and only the names asked for are
decompressed, once each. Nothing of it is a small object: a process's names go back to the
system with it.
"""
import zlib
from array import array
from bisect import bisect_right
from typing import Dict, Iterator, List, Optional, Tuple

BLOCK = 32 << 10  # bytes of names compressed together (a lookup decompresses one block)
ASKED = 4096  # answers of `get` kept (the kernels launched: a launch asks again and again)
_HANDLE = 8  # bytes of one packed handle (little-endian u64)
PID_MASK = 0xFFFFFFFF


class ImageNames:
    """handle -> name for one image. Appends only: a handle taught again is appended again,
    and the last teaching is the one found (`get` looks from the end)."""

    def __init__(self) -> None:
        self._handles = bytearray()  # the handles, in teaching order, packed
        self._starts = array("I")  # each name's offset in its block
        self._blocks: List[bytes] = []  # the sealed blocks, compressed
        self._block_first = array("Q")  # the index of each sealed block's first name
        self._tail = bytearray()  # the names of the block being filled, uncompressed
        self._tail_first = 0  # the index of its first name
        self._asked: Dict[int, Optional[bytes]] = {}  # what `get` found (None: not taught)
        self._open: Tuple[int, bytes] = (-1, b"")  # the last block decompressed

    def __len__(self) -> int:
        return len(self._starts)

    def set(self, handle: int, name: bytes) -> None:
        if len(self._tail) >= BLOCK:
            self._blocks.append(zlib.compress(bytes(self._tail), 6))
            self._block_first.append(self._tail_first)
            self._tail, self._tail_first = bytearray(), len(self._starts)
        self._handles += (handle & 0xFFFFFFFFFFFFFFFF).to_bytes(_HANDLE, "little")
        self._starts.append(len(self._tail))
        self._tail += name
        if handle in self._asked:
            self._asked[handle] = name

    def get(self, handle: int) -> Optional[bytes]:
        if handle not in self._asked:
            if len(self._asked) >= ASKED:
                self._asked.clear()
            index = self._index(handle)
            self._asked[handle] = None if index is None else self._name(index)
        return self._asked[handle]

    def handles(self) -> Iterator[int]:
        """Each handle once, in the order first taught."""
        seen = set()
        for at in range(0, len(self._handles), _HANDLE):
            handle = int.from_bytes(self._handles[at:at + _HANDLE], "little")
            if handle not in seen:
                seen.add(handle)
                yield handle

    def _index(self, handle: int) -> Optional[int]:
        """The index of the last teaching of `handle`, None if it was never taught."""
        needle = (handle & 0xFFFFFFFFFFFFFFFF).to_bytes(_HANDLE, "little")
        end = len(self._handles)
        while True:
            at = self._handles.rfind(needle, 0, end)
            if at < 0:
                return None
            if at % _HANDLE == 0:
                return at // _HANDLE
            end = at + _HANDLE - 1  # (a match across two handles: look before it)

    def _name(self, index: int) -> bytes:
        if index >= self._tail_first:
            data, count = self._tail, len(self._starts)
        else:
            block = bisect_right(self._block_first, index) - 1
            if self._open[0] != block:
                self._open = (block, zlib.decompress(self._blocks[block]))
            data = self._open[1]
            count = (self._block_first[block + 1] if block + 1 < len(self._block_first)
                     else self._tail_first)
        start = self._starts[index]  # (`count`: the index past the block's last name)
        end = self._starts[index + 1] if index + 1 < count else len(data)
        return bytes(data[start:end])


class HandleNames:
    """(image, handle) -> kernel name: one ImageNames per image (names.py's module
    docstring says what an image is)."""

    def __init__(self) -> None:
        self._by_image: Dict[int, ImageNames] = {}

    def get(self, key: Tuple[int, int], default: Optional[str] = None) -> Optional[str]:
        table = self._by_image.get(key[0])
        handle = key[1]  # (None where a failed call gave no handle)
        raw = table.get(handle) if table is not None and isinstance(handle, int) else None
        return default if raw is None else raw.decode("utf-8", "replace")

    def __getitem__(self, key: Tuple[int, int]) -> str:
        name = self.get(key)
        if name is None:
            raise KeyError(key)
        return name

    def __setitem__(self, key: Tuple[int, int], name: str) -> None:
        table = self._by_image.get(key[0])
        if table is None:
            table = self._by_image[key[0]] = ImageNames()
        table.set(key[1], name.encode("utf-8", "replace"))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.get(key) is not None

    def __len__(self) -> int:
        return sum(len(list(table.handles())) for table in self._by_image.values())

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        return ((image, handle) for image, table in list(self._by_image.items())
                for handle in table.handles())

    def forget(self, pid: int) -> None:
        """Drop every image of process `pid`."""
        for image in [i for i in self._by_image if i & PID_MASK == pid]:
            del self._by_image[image]
