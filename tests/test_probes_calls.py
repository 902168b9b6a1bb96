"""Programs shared between functions (function id from the attach cookie): rows with equal
shape keys must generate identical code, or one row would run another's program."""
import itertools

import pytest

from ebpf_cuda.probes import calls as probes
from ebpf_cuda.probes import inflight
from ebpf_cuda.spec.apis import TABLE
from ebpf_cuda.arch import current as current_arch

OPTIONS = [
    probes.ProbeOptions(task_storage=True, wakeup_bytes=1 << 19, follow=True),
    probes.ProbeOptions(task_storage=False, emit_entry=True),
    probes.ProbeOptions(task_storage=True, emit=False, aggregate=True),
    probes.ProbeOptions(task_storage=True, aggregate=True, stacks=True),
    probes.ProbeOptions(stash=False),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "options%d" % OPTIONS.index(o))
@pytest.mark.parametrize("retprobe", [False, True])
def test_equal_shapes_generate_equal_code(options, retprobe):
    if retprobe and not options.stash:
        pytest.skip("no return probes without the entry stash")
    generate = probes.return_program if retprobe else probes.entry_program
    arch = current_arch()
    code = {}
    for api in TABLE:
        code.setdefault(probes.shape_of(api, retprobe, arch, options.aggregate), []).append(
            (api.name, repr(generate(api, probes.FROM_COOKIE, arch, options))))
    shared = 0
    for rows in code.values():
        for (name_a, code_a), (name_b, code_b) in itertools.combinations(rows, 2):
            assert code_a == code_b, (name_a, name_b)
        shared += len(rows) - 1
    assert shared > len(TABLE) // 2  # sharing pays: most rows need no program of their own


def test_cookie_id_and_constant_id_differ_only_in_where_the_id_comes_from():
    api = next(a for a in TABLE if a.name == "cudaMemcpy")
    options = OPTIONS[0]._replace(aggregate=True)
    arch = current_arch()
    constant = repr(probes.return_program(api, 7, arch, options))
    cookie = repr(probes.return_program(api, probes.FROM_COOKIE, arch, options))
    assert constant != cookie
    call_cookie = "imm=%d," % probes.Helper.GET_ATTACH_COOKIE
    assert call_cookie in cookie and call_cookie not in constant


@pytest.mark.parametrize("emit_entry", [False, True])
def test_entry_checks_the_followed_process_before_writing_anything(emit_entry):
    """With task storage the check may be skipped for threads that already have storage,
    but neither storage nor an enter record is ever created for a process not followed."""
    from ebpf_cuda.asm import Helper
    options = probes.ProbeOptions(task_storage=True, follow=True, emit_entry=emit_entry)
    code = [i for i in probes.entry_program(TABLE[0], 0, current_arch(), options)
            if hasattr(i, "opcode")]
    followed = min(k for k, i in enumerate(code) if i.map_name == "followed")
    create = inflight.BPF_LOCAL_STORAGE_GET_F_CREATE
    creates = [k for k, i in enumerate(code)  # mov r4, BPF_LOCAL_STORAGE_GET_F_CREATE
               if i.opcode == 0xB7 and i.dst == 4 and i.imm == create]
    reserves = [k for k, i in enumerate(code)
                if i.opcode == 0x85 and i.imm == Helper.RINGBUF_RESERVE]
    assert creates and all(followed < k for k in creates + reserves)
    assert len(reserves) == 1 + emit_entry  # the thread's hello record (and the enter record)
