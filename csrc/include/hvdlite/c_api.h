/* hvdlite C ABI: the only entry points into the core. Framework adapters
 * (through the pybind11 module hvdlite._core) pass raw buffers and keep them
 * alive until the operation's handle completes.
 *
 * Errors: functions returning int return a status code (0 = OK, values as in
 * csrc/common/status.h StatusCode) and, when `err` is not NULL, write a
 * NUL-terminated message of at most err_len bytes.
 * Threading: every function may be called from any thread.
 */
#ifndef HVDLITE_C_API_H_
#define HVDLITE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HVDLITE_MAX_DIMS 32

typedef struct hvdlite_op {
  int32_t type; /* OpType: 0 allreduce, 1 allgather, 2 broadcast, 3 alltoall, 4 reducescatter, 5 barrier */
  const char* name; /* unique among operations in flight in the process set */
  void* data;       /* input; allreduce and broadcast write the result here in place */
  int32_t dtype;    /* DataType */
  const int64_t* shape;
  int32_t ndim;
  int32_t reduce_op; /* ReduceOp */
  double prescale;
  double postscale;
  int32_t root;          /* broadcast: global root rank */
  const int64_t* splits; /* alltoall: rows per member, or NULL for an even split */
  int32_t nsplits;
  int32_t process_set;
  /* Where `data` lives: -1 host memory; >= 0 the CUDA device ordinal. CUDA data
   * goes to the NCCL module (loaded on first use; allreduce and broadcast) and
   * is read once the work already queued on `stream` is done. The result is
   * complete when the handle completes (the core waits on an event of its own
   * stream, and also makes `stream` wait on it). */
  int32_t device;
  void* stream; /* cudaStream_t of the framework (NULL = legacy default stream) */
} hvdlite_op;

typedef struct hvdlite_output {
  void* data; /* owned by the caller afterwards: free with hvdlite_free_output */
  int64_t nbytes;
  int64_t shape[HVDLITE_MAX_DIMS];
  int32_t ndim;
  int64_t* received_splits; /* alltoall; owned by the caller: free with hvdlite_free_output */
  int32_t nsplits;
  int32_t value; /* add_process_set: the new id */
} hvdlite_output;

int hvdlite_init(char* err, size_t err_len);
int hvdlite_shutdown(char* err, size_t err_len);
int hvdlite_is_initialized(void);
/* -1 when not initialized. which: 0 rank, 1 size, 2 local_rank, 3 local_size, 4 cross_rank, 5 cross_size */
int hvdlite_topology(int which);

int hvdlite_enqueue(const hvdlite_op* op, int64_t* handle, char* err, size_t err_len);
/* 1 done, 0 pending, -1 unknown handle */
int hvdlite_poll(int64_t handle);
/* Waits up to timeout_s; returns the op's status, or 4 (Timeout) while it is still pending. */
int hvdlite_wait(int64_t handle, double timeout_s, char* err, size_t err_len);
/* The caller is about to block until every one of the n handles completes
 * (synchronize()), and later is done: the deadlock detector learns which
 * tensors each blocked rank waits for. Returns a token for hvdlite_wait_end
 * (0 when not initialized or nothing is pending); a token of an ended runtime
 * is ignored. Neither call blocks. */
int64_t hvdlite_wait_begin(const int64_t* handles, int32_t n);
void hvdlite_wait_end(int64_t token);
/* A blocking operation in one call: enqueue, wait_begin (only once the wait
 * has lasted ~20 us: an operation done sooner never registers), and one wait
 * of up to slice_s. Finished (done or failed, or refused by enqueue): wait_end and
 * release have run, *handle and *token are 0, and the status is returned.
 * Still pending after slice_s: returns 4 (Timeout) with *handle and *token
 * set; the caller goes on with hvdlite_wait, then wait_end and release. */
int hvdlite_submit_wait(const hvdlite_op* op, double slice_s, int64_t* handle, int64_t* token, char* err,
                        size_t err_len);
/* Point-to-point (csrc/runtime/p2p.h): kind 0 sends, kind 1 receives `nbytes`
 * bytes at `data` to / from rank `peer` of `process_set` (a rank of the set, not
 * of the job), matched with the other side by (process set, source, tag >= 0).
 * No coordinator and no other rank takes part; `data` must stay valid until
 * the handle completes (a send: once its buffer may be reused, not when the
 * receiver has it). device -1: host memory; device >= 0: CUDA memory on that
 * device, ready (the caller synchronized its stream), moved by the NCCL module
 * (NotSupported when it is absent); a CUDA send waits for its recv. Wait with
 * hvdlite_wait. */
int hvdlite_p2p(int32_t kind, const char* name, void* data, int64_t nbytes, int32_t peer, int32_t tag,
                int32_t process_set, int32_t device, int64_t* handle, char* err, size_t err_len);
/* Moves a completed op's output out and forgets the handle. */
int hvdlite_take_output(int64_t handle, hvdlite_output* out, char* err, size_t err_len);
/* hvdlite_enqueue whose allgather, alltoall or reducescatter writes its result into `output`
 * (output_nbytes of the caller's memory, kept alive until the handle completes) instead of a
 * buffer the core allocates: hvdlite_take_output then gives the shape and splits with data NULL.
 * A result larger than output_nbytes fails the operation with InvalidArgument naming both sizes. */
int hvdlite_enqueue_into(const hvdlite_op* op, void* output, int64_t output_nbytes, int64_t* handle,
                         char* err, size_t err_len);
void hvdlite_release(int64_t handle);
void hvdlite_free_output(void* p);

/* Registers the process set of global ranks `ranks` (ascending). among_members = 0: collective
 * over the whole job (Horovod's add_process_set); 1: only the members call it (a torch subgroup). */
int hvdlite_add_process_set(const int32_t* ranks, int32_t n, int32_t among_members, int32_t* id, char* err,
                            size_t err_len);
/* Unregisters process set `id`. among_members = 0: collective over the whole job (Horovod's
 * remove_process_set); 1: only the set's members call it (a destroyed torch subgroup), in the same
 * order as their other calls on the set. Blocks until every member has called it; a member that
 * never does fails the others' call after HVDLITE_STALL_SHUTDOWN_TIME_SECONDS with a Timeout naming
 * the set, its members and the ranks missing. */
int hvdlite_remove_process_set(int32_t id, int32_t among_members, char* err, size_t err_len);
/* Writes up to cap ids of the registered process sets (ascending, 0 included) as this rank's
 * table holds them (rank 0's also holds the sets it coordinates for others); returns the count. */
int hvdlite_process_set_ids(int32_t* ids, int32_t cap);
/* Writes up to cap ascending member ranks; returns the member count, or -1 for an unknown set. */
int hvdlite_process_set_ranks(int32_t id, int32_t* ranks, int32_t cap);

/* Chrome-trace timeline (rank 0 writes it; other ranks accept and ignore). */
int hvdlite_start_timeline(const char* path, int mark_cycles, char* err, size_t err_len);
int hvdlite_stop_timeline(char* err, size_t err_len);

/* Rendezvous store server (hvdliterun, tests). Returns an opaque pointer or NULL.
 * It serves any number of clients; expected_clients > 0 (the job size) checks at start
 * that the open-file limit (RLIMIT_NOFILE) holds them, else fails naming the limit. */
void* hvdlite_store_server_start(const char* host, int port, const char* secret, size_t secret_len,
                                 int expected_clients, int* bound_port, char* err, size_t err_len);
void hvdlite_store_server_stop(void* server);

/* Comma-separated names of the CPU backends compiled in, e.g. "ring,mpi". */
const char* hvdlite_built_backends(void);
/* 1 when the current job uses MPI (formed through mpirun, or CPU collectives
 * on the mpi backend); 0 otherwise, or when not initialized. */
int hvdlite_mpi_enabled(void);
/* MPI's provided thread level (0 MPI_THREAD_SINGLE .. 3 MPI_THREAD_MULTIPLE)
 * once hvdlite has used MPI in this process; -1 before, or without MPI. */
int hvdlite_mpi_thread_level(void);
/* 1 when the NCCL/CUDA module (libhvdlite_cuda.so) is installed beside the core
 * (it is loaded only when a CUDA tensor first appears); 0 otherwise. */
int hvdlite_gpu_module_installed(void);

/* Counters of the current job since init() (tests assert on them; see
 * hvdlite.common.basics.runtime_stats). */
typedef struct hvdlite_stats {
  int64_t allreduce_responses; /* allreduce responses this rank executed */
  int64_t allreduce_tensors;   /* tensors those responses carried */
  int64_t fused_responses;     /* responses that carried more than one tensor */
  int64_t cache_entries;       /* rank 0: tensors in the response cache; 0 elsewhere */
  int64_t cache_evictions;     /* rank 0: response cache evictions so far; 0 elsewhere */
  int64_t scheduled_responses; /* responses run from the steady-state schedule (no coordinator) */
  int64_t voted_responses;     /* of those, allreduces reduced from the inputs their votes carried */
  int64_t alltoall_bytes_sent; /* bytes this rank's alltoalls sent to other members */
} hvdlite_stats;
/* Fills *out; a Precondition status (and zeros) when not initialized. */
int hvdlite_get_stats(hvdlite_stats* out, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* HVDLITE_C_API_H_ */
