// comm_impl.h — between comm.c (the front end every build shares: argument checks,
// groups of one process, the ordered sums) and a backend (comm_mpi.c or comm_local.c;
// comm_mpi.c hands the data to comm_nccl.c after comm_use_nccl). comm.c calls the
// collectives below only for groups of two or more members.
#pragma once
#include "parallel/comm.h"

typedef enum { CT_FLOAT, CT_DOUBLE, CT_INT32, CT_INT64 } CommType;
#ifdef MT_DOUBLE
#define CT_REAL CT_DOUBLE
#else
#define CT_REAL CT_FLOAT
#endif

size_t comm_type_size(CommType t);
// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... in the element type (t is
// CT_FLOAT or CT_DOUBLE); out may be one of the parts.
void comm_sum_in_order(CommType t, void *out, const void *const *parts, int nparts, size_t count);

// ---- backend: world and groups ----------------------------------------------------------

// Whether to start MPI: MOETRON_MPI=1 / 0 decide; otherwise whether a launcher (mpirun,
// mpiexec, srun) started this process.
int comm_launched(void);

// Returns the world size and sets *rank; *world is the communicator of all processes
// (NULL for one process).
int backend_world_init(int *argc, char ***argv, int *rank, CommImpl **world);
void backend_world_finalize(void);
const char *backend_name(void);
// Collective over the world; member is this process's index in ranks, or -1.
CommImpl *backend_group(const char *name, const int *ranks, int n, int member);
void backend_free(CommImpl *impl);

// ---- backend: collectives of groups of two or more --------------------------------------

// Counts and displacements per group rank, in elements of t. Send and receive blocks may
// share memory only where noted.
void backend_alltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_counts, const size_t *recv_displs);
// send may be recv + displs[g->rank] (in place).
void backend_allgatherv(const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                        const size_t *displs);
// The all-reduces whose result is exact in any order: integer sums, maxima.
typedef enum { REDUCE_SUM, REDUCE_MAX } CommReduceOp;
void backend_allreduce_exact(const Comm *g, CommType t, CommReduceOp op, void *x, size_t n);
void backend_bcast(const Comm *g, void *buf, size_t bytes, int root);
void backend_barrier(const Comm *g);
// 1 when g's float sums must run where the data is (the NCCL path: tensor memory is device
// memory, so the host cannot add the blocks): comm.c then does its blocking reduce-scatters
// and all-reduces as a non-blocking start and a wait, whose sum is a device kernel.
int backend_sums_on_device(const Comm *g);

typedef enum { OP_REDUCE_SCATTER, OP_ALLGATHER, OP_ALLREDUCE, OP_SENDRECV, OP_SEND, OP_RECV, OP_ALLTOALLV } CommOp;
// Start a non-blocking collective over blocks of counts[q] elements (back to back):
//   OP_REDUCE_SCATTER  send: every block, recv: the sum of block g->rank
//   OP_ALLGATHER       send: this rank's block, recv: every block (send may be its place)
//   OP_ALLREDUCE       recv: every block, summed in place (send unused)
//   OP_SENDRECV        send: counts[g->rank] elements to rank (r+1) mod P, recv: as many
//                      from rank (r−1) mod P (send and recv do not overlap); moved with MPI
//                      in every build, NCCL path or not (comm.c stages device memory
//                      through host buffers)
// counts is copied. backend_test returns 1 when done and then has freed the state.
CommPending *backend_istart(const Comm *g, CommOp op, CommType t, const void *send, void *recv,
                            const size_t *counts);
// A non-blocking all-to-all-v (counts and displacements as backend_alltoallv's, copied);
// NULL when it is complete at once (on the NCCL path it runs blocking).
CommPending *backend_ialltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs);
// Point to point: n elements of t to (send) or from group rank peer, matched by tag
// (0 <= tag < COMM_MAX_TAG, a tag space of its own); always over MPI.
CommPending *backend_ipoint(const Comm *g, int send, CommType t, void *buf, size_t n, int peer, int tag);
int backend_test(CommPending *p);
void backend_progress(void);  // comm_progress
void backend_wait(CommPending *p);  // until done; frees the state

// ---- the NCCL data path (comm_nccl.c, comm_sum.cu) ----------------------------------------
//
// comm_mpi.c keeps the groups and their MPI communicators; once comm_use_nccl has turned
// NCCL on, each backend_* call above that moves data goes to the function of the same name
// in the table below instead (backend_barrier stays on MPI: it moves nothing, and every
// blocking NCCL call has completed when it returns). A group's NCCL communicator is made
// from its MPI communicator on the group's first collective on the NCCL path.
//
// The table lives in the cuda plugin (libmoetron_cuda.so, built with NCCL when nccl.h is
// found), which src/core/device.c loads at run time: comm_nccl.c hands it to
// comm_register_nccl as the plugin loads.
#if defined(MT_COMM_NCCL) && !defined(__CUDACC__)
#include <mpi.h>

typedef struct NcclComm NcclComm;        // a group's NCCL communicator
typedef struct NcclPending NcclPending;  // a non-blocking collective queued on NCCL

typedef struct {
    // Selects the GPU (cuda_init(local_rank), nothing when already done), makes the
    // communication stream and its memory; end: releases them (before MPI_Finalize).
    void (*start)(int local_rank);
    void (*end)(void);
    // Collective over the group's members; comm is its MPI communicator.
    NcclComm *(*comm_create)(const Comm *g, MPI_Comm comm);
    void (*comm_free)(NcclComm *nc);
    void (*alltoallv)(NcclComm *nc, const Comm *g, CommType t, const void *send, const size_t *send_counts,
                      const size_t *send_displs, void *recv, const size_t *recv_counts, const size_t *recv_displs);
    void (*allgatherv)(NcclComm *nc, const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                       const size_t *displs);
    void (*allreduce_exact)(NcclComm *nc, const Comm *g, CommType t, CommReduceOp op, void *x, size_t n);
    void (*bcast)(NcclComm *nc, const Comm *g, void *buf, size_t bytes, int root);
    NcclPending *(*istart)(NcclComm *nc, const Comm *g, CommOp op, CommType t, const void *send, void *recv,
                           const size_t *counts);
    int (*test)(NcclPending *p);   // 1 when done, and then has freed p
    void (*wait)(NcclPending *p);  // until done; frees p
} CommNcclPath;

// Called by the plugin as it loads (comm_mpi.c).
void comm_register_nccl(const CommNcclPath *path);
#endif

// What comm_nccl.c (C) needs from CUDA C++ (comm_sum.cu, in the plugin too).
// struct CUstream_st * is cudaStream_t.
#if defined(MT_COMM_NCCL) || defined(__CUDACC__)
#ifdef __cplusplus
extern "C" {
#endif
struct CUstream_st;
// The compute stream of the cuda backend (cuda_stream(), whose declaration is C++ only).
struct CUstream_st *comm_compute_stream(void);
// Queued on stream: out[i] = ((blocks[i] + blocks[count + i]) + blocks[2 count + i]) + ...
// over nparts blocks of count elements back to back, in the element type (t is CT_FLOAT
// or CT_DOUBLE) with IEEE round-to-nearest additions that keep subnormals: the bits of
// comm_sum_in_order. All pointers are device-accessible; out does not overlap blocks.
void comm_sum_blocks_device(CommType t, void *out, const void *blocks, int nparts, size_t count,
                            struct CUstream_st *stream);
#ifdef __cplusplus
}
#endif
#endif
