"""Invariants of the function table that the generator, the decoder and the outputs rely on."""
from ebpf_cuda.spec import apis, record
from ebpf_cuda.spec.apis import Kind


def test_every_row_fits_a_record():
    for api in apis.TABLE:
        assert sum(arg.cells for arg in api.args) <= record.ARG_CELLS, api.name
        assert len(api.outs) <= record.OUT_CELLS, api.name
        names = [a.name for a in api.args] + [o.name for o in api.outs]
        assert len(names) == len(set(names)), api.name


def test_names_and_symbols_are_unique():
    symbols = [s for api in apis.TABLE for s in api.symbols]
    assert len(symbols) == len(set(symbols))


def test_a_func_argument_means_a_launch():
    # The outputs and the summary name kernels for events that carry `func`.
    for api in apis.TABLE:
        has_func = any(a.name == "func" for a in api.args)
        assert has_func == (api.category == "launch"), api.name


def test_learning_rows_name_fields_they_have():
    for api in apis.TABLE:
        fields = {a.name for a in api.args} | {o.name for o in api.outs}
        for pair in (api.learn_name, api.learn_func, api.learn_alias):
            if pair is not None:
                assert set(pair) <= fields, api.name


def test_arguments_in_registers_and_on_the_stack_are_slots_not_overlapping():
    for api in apis.TABLE:
        slots = []
        members = {}  # pointer slot -> bytes read from what it points to
        for arg in api.args:
            if arg.deref and arg.slot in members:  # another member of the same struct
                members[arg.slot] += range(arg.deref_at, arg.deref_at + arg.deref)
                continue
            if arg.deref:
                members[arg.slot] = list(range(arg.deref_at, arg.deref_at + arg.deref))
            width = 1 if arg.deref else (2 if arg.kind == Kind.DIM3 else 1)
            slots += range(arg.slot, arg.slot + width)
        assert len(slots) == len(set(slots)), api.name
        for read in members.values():
            assert len(read) == len(set(read)), api.name


def test_the_seed_functions_lead_the_table():
    assert apis.SEED_FUNCTIONS == (
        "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaLaunchKernel", "cudaStreamCreate",
        "cudaStreamSynchronize", "cudaEventCreate", "cudaEventRecord", "cudaEventSynchronize",
        "cudaGetDevice", "cudaSetDevice")


# ---- roles: what the analyses read -----------------------------------------------------------

ROLE_OF_CATEGORY = {"launch": apis.Role.LAUNCH, "memcpy": apis.Role.COPY,
                    "memset": apis.Role.MEMSET}
ROLES = {apis.Role.ALLOC, apis.Role.FREE, apis.Role.COPY, apis.Role.MEMSET, apis.Role.LAUNCH,
         apis.Role.HOST_REGISTER, apis.Role.HOST_UNREGISTER}
GRAPH_ROLES = {apis.Role.CAPTURE_BEGIN, apis.Role.CAPTURE_END, apis.Role.GRAPH_CREATE,
               apis.Role.KERNEL_NODE, apis.Role.COPY_NODE, apis.Role.MEMSET_NODE,
               apis.Role.CHILD_NODE, apis.Role.EMPTY_NODE, apis.Role.INSTANTIATE,
               apis.Role.EXEC_UPDATE, apis.Role.EXEC_KERNEL_UPDATE, apis.Role.GRAPH_DESTROY,
               apis.Role.EXEC_DESTROY, apis.Role.GRAPH_LAUNCH}
# Rows outside the graph category whose calls join streams to a capture (graphs.py).
CAPTURE_JOINS = {"cudaEventRecord": apis.Role.EVENT_RECORD,
                 "cudaStreamWaitEvent": apis.Role.STREAM_WAIT}
DIRECTIONS = {apis.Direction.HTOH, apis.Direction.HTOD, apis.Direction.DTOH,
              apis.Direction.DTOD, apis.Direction.DEFAULT, apis.Direction.PEER,
              apis.Direction.FROM_KIND}


def _fields(api):
    return {a.name for a in api.args} | {o.name for o in api.outs}


def test_every_row_of_the_analysed_categories_has_its_role():
    for api in apis.TABLE:
        assert api.role in ROLES | GRAPH_ROLES | set(CAPTURE_JOINS.values()) | {None}, api.name
        if api.category == "memory":
            assert api.role in (apis.Role.ALLOC, apis.Role.FREE, apis.Role.HOST_REGISTER,
                                apis.Role.HOST_UNREGISTER), api.name
        elif api.category in ROLE_OF_CATEGORY:
            assert api.role == ROLE_OF_CATEGORY[api.category], api.name
        elif api.category == "graph":  # (the capture mode exchange changes no graph)
            assert api.role in GRAPH_ROLES or "CaptureMode" in api.name, api.name
        else:
            assert api.role == CAPTURE_JOINS.get(api.name), api.name


def test_allocators_and_frees_name_their_pointer_size_and_family():
    for api in apis.TABLE:
        if api.role == apis.Role.ALLOC:
            assert api.ptr in {o.name for o in api.outs}, api.name
            assert api.size and set(api.size) <= _fields(api), api.name
        if api.role == apis.Role.FREE:
            assert api.ptr in {a.name for a in api.args} and not api.size, api.name
        if api.role in (apis.Role.ALLOC, apis.Role.FREE):
            assert api.memory in (apis.DEVICE, apis.HOST), api.name
            assert api.family == (api.library, api.memory)
        else:
            assert api.memory is None and api.family is None, api.name


def test_every_allocator_family_has_a_free_of_its_own():
    frees = {api.family for api in apis.TABLE if api.role == apis.Role.FREE}
    allocs = {api.family for api in apis.TABLE if api.role == apis.Role.ALLOC}
    assert allocs == frees == {(apis.RUNTIME, apis.DEVICE), (apis.RUNTIME, apis.HOST),
                               (apis.DRIVER, apis.DEVICE), (apis.DRIVER, apis.HOST)}


def test_copies_and_memsets_name_their_bytes_and_direction():
    for api in apis.TABLE:
        kinds = [a for a in api.args if a.kind == Kind.MEMCPY_KIND]
        if api.role in (apis.Role.COPY, apis.Role.MEMSET):
            assert api.ptr in {a.name for a in api.args}, api.name
            # bytes are read from the arguments at entry (the in-kernel aggregates too)
            assert api.size and set(api.size) <= {a.name for a in api.args}, api.name
            assert api.elem_size in (1, 2, 4), api.name
        else:
            assert api.elem_size == 1, api.name
        if api.role == apis.Role.COPY:
            assert api.direction in DIRECTIONS, api.name
            assert (api.direction == apis.Direction.FROM_KIND) == (len(kinds) == 1), api.name
        else:  # (a memcpy node's kind is its own: the copy is not made now)
            assert api.direction is None, api.name
            assert not kinds or api.role == apis.Role.COPY_NODE, api.name
    assert apis.BY_NAME["cuMemsetD32_v2"].elem_size == 4
    assert apis.BY_NAME["cudaMemcpy2D"].size == ("width", "height")
    assert apis.BY_NAME["cuMemcpyDtoH_v2"].direction == apis.Direction.DTOH


def test_asynchronous_rows_are_the_stream_ordered_ones():
    for api in apis.TABLE:
        if api.role in (apis.Role.ALLOC, apis.Role.FREE, apis.Role.COPY, apis.Role.MEMSET):
            assert api.asynchronous == ("Async" in api.name), api.name
        elif api.role == apis.Role.LAUNCH:
            assert api.asynchronous, api.name
        else:
            assert not api.asynchronous, api.name


def test_policies_follow_the_category():
    for api in apis.TABLE:
        assert api.teaches_names == (api.category == "module"), api.name
        assert api.captures_stack == (api.category in ("memory", "memcpy", "memset", "sync")
                                      or api.role in (apis.Role.CAPTURE_BEGIN,
                                                      apis.Role.CAPTURE_END,
                                                      apis.Role.GRAPH_LAUNCH,
                                                      apis.Role.HOST_REGISTER)), api.name
        if api.learn_name or api.learn_func or api.learn_alias:
            assert api.teaches_names, api.name
    assert apis.BY_NAME["cuModuleGetFunction"].teaches_names
    assert apis.BY_NAME["cudaMalloc"].captures_stack
    assert apis.BY_NAME["cudaMemcpy"].captures_stack  # (--analyze's native callers)
    assert not apis.BY_NAME["cudaLaunchKernel"].captures_stack
    assert not apis.BY_NAME["cudaGetDevice"].captures_stack
