// comm_local.c — the backend of the build without MPI: one process. The world and every
// group have size 1, so comm.c answers every collective itself (a copy or the identity)
// and the collectives below are never reached.
#ifndef MT_HAVE_MPI
#include "parallel/comm_impl.h"

int backend_world_init(int *argc, char ***argv, int *rank, CommImpl **world) {
    *rank = 0;
    *world = NULL;
    return 1;
}

void backend_world_finalize(void) {}
const char *backend_name(void) { return "none"; }
CommImpl *backend_group(const char *name, const int *ranks, int n, int member) { return NULL; }
void backend_free(CommImpl *impl) {}

static void no_groups_of_two(void) {
    mt_die("internal error: a collective of several processes in a build without MPI (please report)");
}

void backend_alltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_counts, const size_t *recv_displs) {
    no_groups_of_two();
}
void backend_allgatherv(const Comm *g, CommType t, const void *send, void *recv, const size_t *counts,
                        const size_t *displs) {
    no_groups_of_two();
}
void backend_allreduce_exact(const Comm *g, CommType t, CommReduceOp op, void *x, size_t n) { no_groups_of_two(); }
void backend_bcast(const Comm *g, void *buf, size_t bytes, int root) { no_groups_of_two(); }
void backend_barrier(const Comm *g) { no_groups_of_two(); }
int backend_sums_on_device(const Comm *g) { return 0; }
CommPending *backend_istart(const Comm *g, CommOp op, CommType t, const void *send, void *recv,
                            const size_t *counts) {
    no_groups_of_two();
    return NULL;
}
CommPending *backend_ialltoallv(const Comm *g, CommType t, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs) {
    no_groups_of_two();
    return NULL;
}
CommPending *backend_ipoint(const Comm *g, int send, CommType t, void *buf, size_t n, int peer, int tag) {
    no_groups_of_two();
    return NULL;
}
int backend_test(CommPending *p) { return 1; }
void backend_progress(void) {}
void backend_wait(CommPending *p) {}
#endif
