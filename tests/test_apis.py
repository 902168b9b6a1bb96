"""Invariants of the function table that the generator, the decoder and the outputs rely on."""
from ebpf_cuda import apis, record
from ebpf_cuda.apis import Kind


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
        for arg in api.args:
            width = 1 if arg.deref else (2 if arg.kind == Kind.DIM3 else 1)
            slots += range(arg.slot, arg.slot + width)
        assert len(slots) == len(set(slots)), api.name


def test_the_seed_functions_lead_the_table():
    assert apis.SEED_FUNCTIONS == (
        "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaLaunchKernel", "cudaStreamCreate",
        "cudaStreamSynchronize", "cudaEventCreate", "cudaEventRecord", "cudaEventSynchronize",
        "cudaGetDevice", "cudaSetDevice")
