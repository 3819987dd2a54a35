// strict_memory.h — tensor memory that host code cannot touch (--device cpu-strict).
//
// The strict cpu device proves on the CPU that a run reaches tensor memory only through
// ops, communication and explicit copies — as a GPU requires, where tensor memory is
// device memory. Every tensor block (device_calloc) is its own mapping, kept PROT_NONE;
// strict_open() makes every block readable and writable for the length of an op, a
// collective or a copy, strict_close() takes that back (nested pairs count: the memory
// closes when the outermost pair ends). Host code that reads or writes a block outside
// such a pair gets SIGSEGV, which the handler installed by strict_memory_enable turns into
// one line naming the address, the block and its size, and a backtrace of the place.
#pragma once
#include <stddef.h>

// Installs the fault handler; from now on strict_alloc'd blocks are closed outside pairs.
void strict_memory_enable(void);
int strict_memory_enabled(void);
// A zeroed block of `bytes` (a unique one for 0), closed; freed by strict_free.
void *strict_alloc(size_t bytes);
void strict_free(void *p);
// 1 when p points into a strict block.
int strict_owns(const void *p);
// Opens every strict block to host code until the matching strict_close.
void strict_open(void);
void strict_close(void);
