"""The compressed store of kernel names (name_store.py): pure logic, checked against a
plain dict over many names, across sealed blocks, re-taught handles and byte patterns that
straddle two packed handles."""
import random
import tracemalloc

from ebpf_cuda.decode import name_store
from ebpf_cuda.decode.name_store import ImageNames


def _mangled(rng: random.Random, n: int) -> bytes:
    # (PyTorch-like: long shared prefixes, a varying tail)
    return (b"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_"
            + b"%d_functor_" % n + bytes(rng.choice(b"abcdefghij") for _ in range(60)))


def test_every_name_is_found_as_last_taught_across_blocks():
    rng = random.Random(7)
    store, truth = ImageNames(), {}
    for n in range(5000):  # (~600 KB of names: many sealed blocks)
        handle = rng.randrange(1 << 48) if n % 10 else rng.choice(list(truth) or [1])
        name = _mangled(rng, n)
        store.set(handle, name)
        truth[handle] = name
    assert len(store._blocks) > 10
    for handle in rng.sample(list(truth), 2000) + list(truth)[-50:]:
        assert store.get(handle) == truth[handle]
    assert store.get(0xDEAD_BEEF_0000) is None
    assert list(store.handles()) == list(dict.fromkeys(truth))  # (first-taught order)


def test_a_match_straddling_two_handles_is_not_taken():
    store = ImageNames()
    # packed little-endian, the pair (low, high) holds wanted's 8 bytes at offset 4: a
    # match that is no handle
    wanted = 0x1111111122222222
    low = 0x2222222200000000  # its high half is wanted's low half
    high = 0x0000000011111111  # its low half is wanted's high half
    store.set(low, b"low")
    store.set(high, b"high")
    assert bytes(store._handles).find(wanted.to_bytes(8, "little")) == 4
    assert store.get(wanted) is None
    store.set(wanted, b"wanted")
    assert store.get(wanted) == b"wanted" and store.get(low) == b"low"


def test_a_re_teaching_replaces_an_answer_already_given():
    store = ImageNames()
    store.set(0x40, b"first")
    assert store.get(0x40) == b"first"
    store.set(0x40, b"second")  # (a module loaded again at the same handle)
    assert store.get(0x40) == b"second"


def test_answers_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(name_store, "ASKED", 8)
    store = ImageNames()
    for handle in range(100):
        store.set(handle, b"k%d" % handle)
    for handle in range(100):
        assert store.get(handle) == b"k%d" % handle
        assert len(store._asked) <= 8


def test_thirty_thousand_names_take_a_fraction_of_their_size():
    rng = random.Random(1)
    names = [_mangled(rng, n) + b"x" * 100 for n in range(30000)]  # (~7 MB of names)
    tracemalloc.start()
    store = ImageNames()
    for n, name in enumerate(names):
        store.set(0x7F0000000000 + 16 * n, name)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # 8 bytes a handle + 4 an offset + the compressed name (its 60 random letters alone
    # are ~25 bytes): under 64 bytes a name of ~227 (as a dict of str: ~430)
    assert sum(map(len, names)) > 220 * len(names) and held < 64 * len(names), held
    assert store.get(0x7F0000000000 + 16 * 12345) == names[12345]
