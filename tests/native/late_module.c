/*
 * late_module.c: the exported entry of a library that carries the CUDA runtime inside it,
 * as CuPy's extension modules carry cudart statically. Built by tests/test_late_load.py
 * together with fakecudart.c into one shared library whose version script exports
 * module_* alone: the runtime's functions are then local symbols (.symtab only), and
 * module_malloc calls the cudaMalloc inside the library.
 */
#include <stddef.h>

int cudaMalloc(void **ptr, size_t size);

int module_malloc(void **ptr, size_t size) { return cudaMalloc(ptr, size); }
