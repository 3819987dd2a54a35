// comm.h — the processes of a run and collectives over named process groups.
//
// Two builds implement this header (docs/parallelism.md): comm_mpi.c (MPI, -DMT_HAVE_MPI;
// with CUDA and NCCL it can hand the data to comm_nccl.c, see comm_use_nccl) and
// comm_local.c (one process: the world and every group have size 1, every collective is
// a copy or the identity). The single-process path is the parallel path with trivial
// groups: the trainer makes the same calls in both builds.
//
// Conventions of every collective:
//   - counts and displacements are in elements; buffers of different ranks may differ;
//   - every member of the group calls it, in the same order as the other members;
//   - sums are deterministic: element i of a sum over a group of P members is
//     ((x_0 + x_1) + x_2) + ... + x_{P-1} computed in the element type, x_q the
//     contribution of the group's rank q. The result is the same on every member, on
//     every run, for any buffer length or chunking, and equals a serial loop over the
//     ranks. (MPI_Allreduce's order is unspecified, so moetron sums itself.)
//   - a group of one process never calls MPI: its collectives are copies.
#pragma once
#include "core/common.h"

typedef struct CommImpl CommImpl;  // the backend's communicator (NULL for one process)

typedef struct {
    const char *name;  // "dp", "ep", ... for messages; the string must outlive the Comm
    int rank, size;    // this process's rank in the group and the group's size; a
                       // process outside the group (see comm_group) has rank -1, size 0
    CommImpl *impl;
} Comm;

// ---- the world ------------------------------------------------------------------------

// Start the processes' communication (first thing in main). The MPI build initialises
// MPI when the process was started by an MPI launcher (mpirun/mpiexec, srun: the
// variables OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or SLURM_NTASKS are set) or when
// MOETRON_MPI=1; MOETRON_MPI=0 forces one process. With more than one process, mt_die
// prefixes "[rank N] " and aborts every process.
void comm_world_init(int *argc, char ***argv);
void comm_world_finalize(void);
int comm_world_rank(void);
int comm_world_size(void);
// All processes, in world-rank order.
Comm comm_world(void);
// The MPI library when MPI is compiled in ("Open MPI v4.1.4"), "none" otherwise.
const char *comm_backend_name(void);

// ---- groups -----------------------------------------------------------------------------

// The trivial group of this process alone.
Comm comm_self(const char *name);
// A group of the world ranks ranks[0..n-1] (distinct); group rank i is ranks[i]. Collective
// over the world: every process calls it at the same point, each passing the list of the
// group it belongs to (members of one group pass the same list), or any list without
// itself to stay out (it gets size 0). Dies with one line when members disagree.
Comm comm_group(const char *name, const int *ranks, int n);
// Release a group made by comm_group or comm_world (comm_self needs nothing).
void comm_free(Comm *g);

// ---- collectives (blocking) ---------------------------------------------------------------

// In place: x (n) becomes the sum over the group, on every member.
void comm_allreduce_sum(const Comm *g, real *x, size_t n);
void comm_allreduce_sum_double(const Comm *g, double *x, size_t n);
void comm_allreduce_sum_int64(const Comm *g, int64_t *x, size_t n);
// In place: x (n) becomes the elementwise maximum over the group (exact: any order gives it,
// but for the sign of a zero that ranks hold as +0 and -0).
void comm_allreduce_max(const Comm *g, real *x, size_t n);
// send holds size blocks of `block` elements; rank r receives in recv the sum of block r.
void comm_reduce_scatter(const Comm *g, const real *send, real *recv, size_t block);
// As comm_reduce_scatter with block q of counts[q] elements (blocks back to back in send).
void comm_reduce_scatter_v(const Comm *g, const real *send, real *recv, const size_t *counts);
// recv holds size blocks of `block` elements; block q is rank q's send.
void comm_allgather(const Comm *g, const real *send, real *recv, size_t block);
void comm_allgather_int32(const Comm *g, const int32_t *send, int32_t *recv, size_t block);
// As comm_allgather with rank q sending counts[q] elements (blocks back to back in recv).
void comm_allgather_v(const Comm *g, const real *send, real *recv, const size_t *counts);
void comm_allgather_int64(const Comm *g, const int64_t *send, int64_t *recv, size_t block);
// Member root receives every member's piece: rank q sends its send_count elements, which land
// at recv + displs[q] on root; counts[q] (rank q's send_count) and displs are read on root
// only, recv is written on root only (the others may pass NULL). Pieces must not overlap.
void comm_gather_v(const Comm *g, const real *send, size_t send_count, real *recv, const size_t *counts,
                   const size_t *displs, int root);
// Block q of send (`block` elements) goes to rank q; block q of recv comes from rank q.
void comm_alltoall(const Comm *g, const real *send, real *recv, size_t block);
void comm_alltoall_int32(const Comm *g, const int32_t *send, int32_t *recv, size_t block);
// send_counts[q] elements from send + send_displs[q] go to rank q; recv_counts[q]
// elements from rank q land at recv + recv_displs[q] (recv_counts[q] must equal rank q's
// send_counts[rank]).
void comm_alltoall_v(const Comm *g, const real *send, const size_t *send_counts, const size_t *send_displs,
                     real *recv, const size_t *recv_counts, const size_t *recv_displs);
void comm_alltoall_v_int32(const Comm *g, const int32_t *send, const size_t *send_counts,
                           const size_t *send_displs, int32_t *recv, const size_t *recv_counts,
                           const size_t *recv_displs);
// Copy `bytes` bytes of root's buf to every member's buf.
void comm_bcast(const Comm *g, void *buf, size_t bytes, int root);
void comm_barrier(const Comm *g);

// ---- bytes sent --------------------------------------------------------------------------
//
// Every collective on a group of two or more members adds to a count kept per group name
// ("tp", "dp", ...; groups of one name add together) the bytes this rank sends to the other
// members as comm.c moves the data (P members, es the element size, c_q the elements of
// group rank q's block, r this rank; groups of one send nothing):
//   all-to-all(-v), gather      Σ_{q≠r} send_counts[q]·es
//   all-gather(-v)              (P−1)·c_r·es: its block to every other member
//   reduce-scatter(-v)          Σ_{q≠r} c_q·es: every other member its block
//   all-reduce of n elements    a reduce-scatter then an all-gather of the even split
//                               (c_q = ⌈n/P⌉ for q < n mod P, else ⌊n/P⌋), per chunk of at
//                               most 2^22 elements: (n − c_r + (P−1)·c_r)·es, which is the
//                               ring volume 2(P−1)/P·n·es when P divides n, and n·es for
//                               P = 2; int64 all-reduces are counted alike (es 8)
//   broadcast                   (P−1)·bytes on the root, 0 elsewhere; barrier 0
//   ring shift of n elements    n·es (to the next rank)
//   send of n elements          n·es (receives count nothing)
// A non-blocking collective counts when it starts. Collectives are issued from one thread.
//
// The elements this rank sends in an all-reduce of n elements over g, as counted above (its
// chunks, each split evenly): for planning a run (train/comm_plan.c); g may be described only.
size_t comm_allreduce_elements_sent(const Comm *g, size_t n);
// The bytes sent on groups named `name` since the last take (or reset); restarts its count.
uint64_t comm_bytes_take(const char *name);
// Restarts every group's count.
void comm_bytes_reset(void);

// ---- collectives (non-blocking) ---------------------------------------------------------

// A collective in flight. Until comm_wait returns, its buffers belong to it (neither read
// nor written by the caller), and the group runs other collectives normally (blocking or
// not). comm_test moves it on: call it between pieces of compute for the transfers to
// overlap with that compute (MPI progresses mostly inside MPI calls).
typedef struct CommPending CommPending;
typedef struct {
    CommPending *pending;  // NULL once complete
    // A point-to-point transfer or ring shift staged through host memory (comm.c): its host
    // block (the bytes sent, then those received), and where the received bytes go.
    void *staging;
    size_t staged_send_bytes, staged_recv_bytes;
    void *staged_recv;
} CommRequest;

void comm_iallreduce_sum(const Comm *g, real *x, size_t n, CommRequest *req);
void comm_ireduce_scatter(const Comm *g, const real *send, real *recv, size_t block, CommRequest *req);
void comm_ireduce_scatter_v(const Comm *g, const real *send, real *recv, const size_t *counts,
                            CommRequest *req);
void comm_iallgather(const Comm *g, const real *send, real *recv, size_t block, CommRequest *req);
void comm_iallgather_v(const Comm *g, const real *send, real *recv, const size_t *counts, CommRequest *req);
// The ring shift: send (n) goes to group rank (r+1) mod P, recv (n) comes from rank
// (r−1+P) mod P; send and recv must not overlap. A group of one copies send to recv. The
// data moves with MPI even after comm_use_nccl; where tensor memory is not host memory (a
// GPU, cpu-strict) through host buffers: the send's bytes are downloaded when it starts,
// the received bytes uploaded when comm_test / comm_wait sees it complete (any MPI will do).
void comm_isendrecv(const Comm *g, const real *send, real *recv, size_t n, CommRequest *req);
void comm_sendrecv(const Comm *g, const real *send, real *recv, size_t n);  // blocking
// comm_alltoall_v in flight (its counts are read at the call). After comm_use_nccl it moves
// the data at once with NCCL (blocking; the request is complete on return).
void comm_ialltoall_v(const Comm *g, const real *send, const size_t *send_counts, const size_t *send_displs,
                      real *recv, const size_t *recv_counts, const size_t *recv_displs, CommRequest *req);
// comm_alltoall_int32 in flight, the same way.
void comm_ialltoall_int32(const Comm *g, const int32_t *send, int32_t *recv, size_t block, CommRequest *req);
// Point to point: n elements of buf to group rank `peer`, or from it into buf, matched with
// the peer's call of the other kind by tag (0 <= tag < COMM_MAX_TAG; messages of one tag
// between two ranks arrive in the order they were sent); the sizes must agree. Moved with MPI
// in every build, NCCL path or not, staged through host memory as comm_isendrecv. A send
// counts n elements when it starts.
#define COMM_MAX_TAG (1 << 13)
void comm_isend(const Comm *g, const real *buf, size_t n, int peer, int tag, CommRequest *req);
void comm_irecv(const Comm *g, real *buf, size_t n, int peer, int tag, CommRequest *req);
// Moves every non-blocking transfer of this process on without completing any (MPI moves
// data mostly inside MPI calls): called between pieces of compute (ops_set_between_ops), so
// that transfers in flight progress while the process computes. Cheap when none is.
void comm_progress(void);
// 1 when the collective has completed (its results are in place), 0 while in flight.
int comm_test(CommRequest *req);
void comm_wait(CommRequest *req);

// ---- the NCCL data path (builds with MPI and CUDA) ------------------------------------------

#if defined(MT_HAVE_MPI) && defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
#define MT_COMM_NCCL 1
// From this call on, the collectives of groups of two or more processes move their data
// with NCCL between the GPUs instead of with MPI (comm_nccl.c, in the cuda plugin); nothing
// else changes: the same calls, the same sums in rank order, the same bits. Collective over
// the world: every process calls it once at the same point, after device_select(DEVICE_CUDA)
// (which loads the plugin) and before the first collective on device memory; later calls
// return 1 at once. local_rank (the process's index on its machine) selects the GPU as
// cuda_init does, a no-op when the cuda backend has started already. Returns 1 when NCCL
// moves the data from now on; 0, and MPI keeps moving it (the trainer then refuses a
// multi-GPU run: MPI's collectives cannot sum device memory), for a world of one process, when MOETRON_NCCL=0 is set, or when the loaded plugin has no NCCL
// (built without nccl.h) or no plugin is loaded. Every process gets the same answer. With
// NCCL:
//   - buffers may be device or host memory: device memory is used in place, host memory
//     goes through a device copy (correct, slower);
//   - a collective reads its inputs after the work queued on the compute stream
//     (cuda_stream()) before the call, and its results are in place, for the host and
//     for the work queued after, when the blocking call (or comm_test / comm_wait)
//     returns; a non-blocking one runs on a stream of its own while the compute goes on;
//   - the sums run on the GPU (the blocking reduce-scatter and all-reduce start and wait
//     for the non-blocking ones), in rank order as on the host;
//   - the watchdog (--distributed-timeout-minutes) covers the waits, and an error NCCL
//     reports aborts its communicator and ends every rank with one line.
// MOETRON_NCCL=1 selects the GPU and calls it at comm_world_init (for tests).
int comm_use_nccl(int local_rank);
#endif
