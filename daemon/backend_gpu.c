/* backend_gpu.c - forward attention on the GPU: one worker thread per visible device, each
 * owning a CUDA stream in the device's primary context.
 *
 * Synchronous mode: the client synchronised its own stream before sending; the worker enqueues
 * the kernel (fa_gpu_attn_fwd) and hands the job back to the loop when the event recorded after
 * it completes (same done() contract as the CPU backend: uv_async, exactly once per job). The
 * worker enqueues up to GPU_PIPE queued jobs back to back before waiting for the first, so the
 * GPU does not idle for a launch between two clients' kernels.
 *
 * Asynchronous mode (device buffers, a client of the daemon's uid): the job runs on a stream and
 * a thread of its session (so a client whose event never fires stalls only itself), behind a
 * wait on the client's CUDA IPC event; the daemon records its own IPC event (one per session and slot) after
 * the kernel and the job is handed back twice: at the enqueue (the reply carries the event) and
 * when a host function queued behind the kernel runs (the request's regions are released then).
 *
 * Health: every device runs a canary (a small attention checked against the float64 reference)
 * at least once a second between jobs; the watchdog is fed only while every device's canary
 * passed recently (gpu_healthy). A wrong canary result is a fault.
 *
 * Memory:
 *   - CUDA IPC regions: the handle is opened once per registration (region_open, on the loop
 *     thread with the primary context current: the driver is thread-safe and the context is the
 *     worker's too) and closed by the region's last reference, i.e. after every job using it
 *     finished. Opening costs ~0.5 ms, closing ~0.2 ms on the H200.
 *   - Host shm regions: pinned with cuMemHostRegister at registration (unpinned before the
 *     unmap); each job copies Q, K, V (and O, lse when strided, to keep the bytes between their
 *     elements) into device scratch, runs, and copies O and lse back. Simple and correct; costs
 *     two PCIe transfers per request (about 50 GB/s pinned) on top of the kernel.
 * Faults: this file classifies CUDA errors (gpu_sticky). One that poisons the context (illegal
 * address, assert, launch failure...) is marked with fault_mark and makes every queued and later
 * job fail with FA_EDEVICE; the rest of the fatal path (STOPPING=1, the drain, exit status 70 for
 * systemd's Restart=on-failure) is the server's, in fault.c. Other errors fail their job only.
 */
#include "backend.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile_pool.h"
#include "fa_gpu.h"
#include "fa_tune.h"
#include "fault.h"
#include "log.h"
#include "region.h"
#include "util.h"

#define GPU_SCRATCH_ALIGN 256
#define GPU_SCRATCH_MIN (8u << 20) /* first scratch allocation; grows to the largest request */
#define GPU_MAX_DEVICES 16         /* one worker per device */
#define GPU_PIPE 8                 /* synchronous jobs enqueued before the first is waited for */
#define GPU_CANARY_EVERY_NS 1000000000ull  /* a canary between jobs (or idle) this often */
#define GPU_CANARY_STALE_NS 20000000000ull /* no pass for this long: unhealthy (watchdog) */
#define GPU_CANARY_TOL 5e-3                /* fp16 canary, relative Frobenius error */
#define GPU_CLOSE_WAIT_NS 10000000000ull   /* close: wait this long for async kernels */
/* After a job, the idle worker spins this long before sleeping: a synchronous client's next
 * request arrives tens of microseconds after its reply, and a futex wake-up costs about as
 * much as the whole daemon's own work on a small request. */
#define GPU_SPIN_NS 200000ull
/* A small synchronous job on an idle GPU runs on the loop thread itself (gpu_try_inline): two
 * thread hand-offs cost more than such a kernel. The loop is blocked for the kernel's time, so
 * only below this many FLOPs (about 5 us of an H200). */
#define GPU_INLINE_MAX_FLOP 1.0e9
/* While a job below this many FLOPs (about 200 us of an H200) is on a worker, the loop polls
 * without sleeping (a uv_idle handle): waking a sleeping loop thread costs 10-20 us, a large
 * share of such a request's time; longer kernels hide it, and need no spinning core. */
#define GPU_LOOP_SPIN_MAX_FLOP 6.4e10
#define GPU_EVENT_DISABLE_TIMING 0x2
#define GPU_EVENT_INTERPROCESS 0x4
#define GPU_MAX_COMPILE_THREADS 16 /* --compile-threads' bound */
#define GPU_TUNE_SLICE_US 2000     /* background tuning: one step of the tuner between jobs */

typedef int gpu_res;
typedef void *gpu_ctx;
typedef void *gpu_stream;
typedef void *gpu_event;
typedef unsigned long long gpu_ptr;

/* CUipcMemHandle: 64 opaque bytes, passed by value. */
struct gpu_ipc_handle {
	char reserved[FA_PROTO_IPC_HANDLE_LEN];
};

/* CUipcEventHandle: 64 opaque bytes, passed by value. */
struct gpu_ipc_event {
	char reserved[FA_PROTO_IPC_HANDLE_LEN];
};

/* The driver entry points this file needs beyond fa_gpu's (CUDA 12.0 ABI, cuGetProcAddress). */
struct gpu_cu {
	void *lib;
	gpu_res (*GetErrorString)(gpu_res, const char **);
	gpu_res (*DeviceGetCount)(int *);
	gpu_res (*DeviceGet)(int *, int);
	gpu_res (*DevicePrimaryCtxRetain)(gpu_ctx *, int);
	gpu_res (*DevicePrimaryCtxRelease)(int);
	gpu_res (*CtxSetCurrent)(gpu_ctx);
	gpu_res (*CtxSynchronize)(void);
	gpu_res (*StreamCreate)(gpu_stream *, unsigned);
	gpu_res (*StreamDestroy)(gpu_stream);
	gpu_res (*StreamSynchronize)(gpu_stream);
	gpu_res (*MemAlloc)(gpu_ptr *, size_t);
	gpu_res (*MemFree)(gpu_ptr);
	gpu_res (*MemcpyHtoDAsync)(gpu_ptr, const void *, size_t, gpu_stream);
	gpu_res (*MemcpyDtoHAsync)(void *, gpu_ptr, size_t, gpu_stream);
	gpu_res (*MemHostRegister)(void *, size_t, unsigned);
	gpu_res (*MemHostUnregister)(void *);
	gpu_res (*MemGetAddressRange)(gpu_ptr *, size_t *, gpu_ptr);
	gpu_res (*IpcOpenMemHandle)(gpu_ptr *, struct gpu_ipc_handle, unsigned);
	gpu_res (*IpcCloseMemHandle)(gpu_ptr);
	gpu_res (*MemsetD8Async)(gpu_ptr, unsigned char, size_t, gpu_stream);
	gpu_res (*EventCreate)(gpu_event *, unsigned);
	gpu_res (*EventDestroy)(gpu_event);
	gpu_res (*EventRecord)(gpu_event, gpu_stream);
	gpu_res (*EventSynchronize)(gpu_event);
	gpu_res (*StreamWaitEvent)(gpu_stream, gpu_event, unsigned);
	gpu_res (*IpcGetEventHandle)(struct gpu_ipc_event *, gpu_event);
	gpu_res (*IpcOpenEventHandle)(gpu_event *, struct gpu_ipc_event);
	gpu_res (*LaunchHostFunc)(gpu_stream, void (*)(void *), void *);
};

/* One session's asynchronous-mode resources on one device: its stream, its thread, and per slot
 * the daemon's completion event and the client's opened event (the thread's only).
 * Why a thread per session: cuStreamWaitEvent on another process's IPC event costs ~125 us of
 * host time per call on the H200 (it does not wait for the event: a client whose event never
 * fires still gets its reply; tests/integ/test_gpu_async.c), and that cost must not delay the
 * device worker's synchronous jobs of other clients. */
struct gpu_owner_dev {
	struct gpu_dev *d;
	pthread_t thread;
	pthread_cond_t cv;                       /* with b->mu */
	struct backend_job *head, *tail;         /* under b->mu: jobs for the thread */
	bool stop;                               /* under b->mu */
	gpu_stream stream;
	struct {
		gpu_event done;
		uint8_t done_handle[FA_PROTO_IPC_HANDLE_LEN];
		gpu_event wait;
		uint8_t wait_handle[FA_PROTO_IPC_HANDLE_LEN];
	} slot[FA_PROTO_MAX_SLOTS];
};

/* A session's backend state (*job->owner_state): created under the mutex, freed on the loop by
 * gpu_owner_free when the session is freed (every job of it was handed back for good). */
struct gpu_owner {
	struct gpu_owner_dev *dev[GPU_MAX_DEVICES];
};

/* An asynchronous job whose kernel is enqueued: the host function's argument. On the fatal
 * path the job is finished without it (abandoned); the host function, if it ever runs, then
 * only frees the ticket. */
struct gpu_ticket {
	struct gpu_backend *b;
	struct backend_job *job;
	uint64_t t0;
	bool abandoned;
	struct gpu_ticket *prev, *next; /* b->tickets, under b->mu */
};

struct gpu_backend;

/* One device and its worker. */
struct gpu_dev {
	struct gpu_backend *b;
	struct fa_gpu *g;
	int ordinal;
	int cudev;
	gpu_ctx ctx;
	gpu_stream stream;
	uint8_t uuid[16];
	pthread_t thread;
	bool thread_started;
	struct backend_job *run_head, *run_tail; /* under b->mu */
	gpu_ptr scratch;                         /* worker only */
	size_t scratch_size;
	gpu_event pipe_ev[GPU_PIPE];             /* worker: one per job in flight */
	atomic_uint pushes;                      /* jobs queued so far: the idle worker spins on it */
	bool busy;                               /* under b->mu: the worker runs a batch */
	gpu_stream inline_stream;                /* loop thread: gpu_try_inline's */
	gpu_event inline_ev;
	uint64_t inline_jobs;                    /* under b->mu */
	/* The canary (worker only, but canary_ok_ns which the loop reads). */
	struct fa_attn_fwd_desc canary_desc;
	struct fa_tile canary_tile;              /* the planner's first: never the tuning table's */
	gpu_ptr canary_mem;                      /* q, k, v, o */
	size_t canary_bytes;                     /* of one tensor */
	double *canary_ref;                      /* float64 reference output */
	uint16_t *canary_out;                    /* the result, copied back */
	uint64_t canary_last_ns;                 /* last run started */
	_Atomic uint64_t canary_ok_ns;           /* last pass (or the start) */
	uint64_t canary_runs, canary_failed;     /* under b->mu */
	double canary_err;                       /* last relative error, under b->mu */
};

struct gpu_backend {
	struct backend base;
	struct gpu_cu cu;
	uv_loop_t *loop;
	uv_async_t async;
	bool async_open;
	uv_idle_t spin;                  /* started while spin_jobs > 0 (loop thread) */
	bool spin_open;
	unsigned spin_jobs;
	unsigned handles_open;           /* async and spin: freed when both are closed */
	backend_done_fn done;
	void *done_arg;
	void (*closed)(void *arg);
	void *closed_arg;
	struct gpu_dev devs[GPU_MAX_DEVICES];
	unsigned ndevs;
	unsigned rr;                     /* loop: round robin for host-only jobs */

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct backend_job *done_head, *done_tail;
	bool stopping;
	uint64_t fwd_ok, fwd_failed;   /* under mu */
	uint64_t h2d_bytes, d2h_bytes; /* under mu: staging traffic of host regions */
	uint64_t async_enqueued;       /* under mu: asynchronous jobs enqueued */
	uint64_t lat_ns[4], lat_n;     /* under mu: sync jobs' submit->pick, pick->done, done->loop,
	                                * and inline runs' time (where a request's time goes) */
	uint64_t async_ns[4];          /* under mu: host time in the client-event wait, the launch,
	                                * the event record, cuLaunchHostFunc (where async time goes) */
	struct gpu_ticket *tickets;    /* under mu: asynchronous kernels not finished */
	unsigned ntickets;

	/* Compile pool: jobs whose kernel is not loaded wait in `waiting` (under mu) while a
	 * compile thread prepares it (fa_gpu_prepare, without mu); then they go to the worker. */
	struct compile_table waiting;     /* under mu */
	pthread_cond_t compile_cv;        /* compile threads wait here (with mu) */
	pthread_t compile_thr[GPU_MAX_COMPILE_THREADS];
	unsigned ncompile;                /* compile threads started */
	uint64_t compiles, compiles_failed, compile_jobs; /* under mu */

	/* Background tuning (fa_tune.h): device 0's worker steps a tuner while its queue is
	 * empty; the candidates' kernels are compiled by the compile threads first (lowest
	 * priority) so a step only runs kernels. */
	struct fa_tune_table *tune;       /* NULL: none (heuristic tiles only) */
	bool tune_idle;                   /* --tune idle and the GPU ops could be made */
	struct fa_tune_ops tune_ops;      /* fa_tune_gpu_ops_init's */
	bool tune_ops_ok;
	struct fa_tuner *tuner;           /* worker only */
	bool tune_prepping;               /* under mu: the candidates are being compiled */
	struct fa_attn_fwd_desc tune_desc; /* under mu: the class' tuning shape */
	struct fa_tile tune_tiles[FA_TUNE_DEFAULT_CANDIDATES]; /* under mu */
	int tune_ntiles, tune_next, tune_left; /* under mu: candidates, next to compile, not done */
	bool tune_save;                   /* under mu: a compile thread saves the table */
	uint64_t tuned, tune_failed;      /* under mu */
};

/* ---- driver ---------------------------------------------------------------------------------- */

/* The driver's name for a result. */
static const char *gpu_errstr(const struct gpu_backend *b, gpu_res r)
{
	const char *s = NULL;

	if (b->cu.GetErrorString != NULL && b->cu.GetErrorString(r, &s) == 0 && s != NULL)
		return s;
	return "unknown CUDA error";
}

/* Errors after which the context is unusable (every later call returns them): cuda.h's
 * CUresult list. Everything else concerns one call only. */
static bool gpu_sticky(gpu_res r)
{
	switch (r) {
	case 214: /* ECC_UNCORRECTABLE */
	case 220: /* NVLINK_UNCORRECTABLE */
	case 226: /* CONTAINED */
	case 700: /* ILLEGAL_ADDRESS */
	case 702: /* LAUNCH_TIMEOUT */
	case 709: /* CONTEXT_IS_DESTROYED */
	case 710: /* ASSERT */
	case 714: /* HARDWARE_STACK_ERROR */
	case 715: /* ILLEGAL_INSTRUCTION */
	case 716: /* MISALIGNED_ADDRESS */
	case 717: /* INVALID_ADDRESS_SPACE */
	case 718: /* INVALID_PC */
	case 719: /* LAUNCH_FAILED */
	case 721: /* TENSOR_MEMORY_LEAK */
	case 999: /* UNKNOWN */
		return true;
	default:
		return false;
	}
}

/* dlopen the driver and fetch the entry points (fa_gpu_open succeeded, so it is there). */
static fa_status gpu_load_driver(struct gpu_cu *cu, char *err, size_t errlen)
{
	typedef gpu_res (*getproc_t)(const char *, void **, int, uint64_t, int *);
	getproc_t getproc;

	cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (cu->lib == NULL)
		return util_fail(err, errlen, FA_ENOGPU, "libcuda.so.1 cannot be loaded (%s)",
		                 dlerror());
	getproc = (getproc_t)(uintptr_t)dlsym(cu->lib, "cuGetProcAddress_v2");
	if (getproc == NULL)
		return util_fail(err, errlen, FA_ENOGPU, "CUDA driver too old: no cuGetProcAddress_v2");
#define GPU_SYM(field, name)                                                                   \
	do {                                                                                   \
		int st_ = 0;                                                                   \
		if (getproc(name, (void **)&cu->field, 12000, 0, &st_) != 0 ||                 \
		    cu->field == NULL)                                                         \
			return util_fail(err, errlen, FA_ENOGPU, "CUDA driver lacks %s", name); \
	} while (0)
	GPU_SYM(GetErrorString, "cuGetErrorString");
	GPU_SYM(DeviceGetCount, "cuDeviceGetCount");
	GPU_SYM(DeviceGet, "cuDeviceGet");
	GPU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	GPU_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
	GPU_SYM(CtxSetCurrent, "cuCtxSetCurrent");
	GPU_SYM(CtxSynchronize, "cuCtxSynchronize");
	GPU_SYM(StreamCreate, "cuStreamCreate");
	GPU_SYM(StreamDestroy, "cuStreamDestroy");
	GPU_SYM(StreamSynchronize, "cuStreamSynchronize");
	GPU_SYM(MemAlloc, "cuMemAlloc");
	GPU_SYM(MemFree, "cuMemFree");
	GPU_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
	GPU_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
	GPU_SYM(MemHostRegister, "cuMemHostRegister");
	GPU_SYM(MemHostUnregister, "cuMemHostUnregister");
	GPU_SYM(MemGetAddressRange, "cuMemGetAddressRange");
	GPU_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle");
	GPU_SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle");
	GPU_SYM(MemsetD8Async, "cuMemsetD8Async");
	GPU_SYM(EventCreate, "cuEventCreate");
	GPU_SYM(EventDestroy, "cuEventDestroy");
	GPU_SYM(EventRecord, "cuEventRecord");
	GPU_SYM(EventSynchronize, "cuEventSynchronize");
	GPU_SYM(StreamWaitEvent, "cuStreamWaitEvent");
	GPU_SYM(IpcGetEventHandle, "cuIpcGetEventHandle");
	GPU_SYM(IpcOpenEventHandle, "cuIpcOpenEventHandle");
	GPU_SYM(LaunchHostFunc, "cuLaunchHostFunc");
#undef GPU_SYM
	return FA_OK;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it. */
static void gpu_uuid_text(const uint8_t u[16], char out[48])
{
	static const char hex[] = "0123456789abcdef";
	char *p = out;

	p += sprintf(p, "GPU-");
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[u[i] >> 4];
		*p++ = hex[u[i] & 15];
	}
	*p = '\0';
}

/* ---- queues (mutex held) ----------------------------------------------------------------------- */

/* A polite busy-wait step. */
static inline void gpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Queue a job on d's worker (mutex held; the caller wakes it). */
static void gpu_queue_locked(struct gpu_dev *d, struct backend_job *job)
{
	backend_job_append(&d->run_head, &d->run_tail, job);
	atomic_fetch_add(&d->pushes, 1);
}

/* Finish a job that will not run, with status and detail (mutex held). */
static void gpu_finish_locked(struct gpu_backend *b, struct backend_job *job, fa_status st,
                              const char *detail)
{
	job->status = st;
	snprintf(job->detail, sizeof job->detail, "%s", detail);
	backend_job_append(&b->done_head, &b->done_tail, job);
}

/* Answer the jobs of owner (all: NULL) waiting for a compile with st and why (mutex held; the
 * caller wakes the loop). Returns how many. */
static unsigned gpu_fail_waiting_locked(struct gpu_backend *b, const void *owner, fa_status st,
                                        const char *why)
{
	unsigned n = 0;
	struct backend_job *job = compile_table_cancel(&b->waiting, owner, &n);

	while (job != NULL) {
		struct backend_job *next = job->next;
		gpu_finish_locked(b, job, st, why);
		job = next;
	}
	return n;
}

/* The second hand-back of an asynchronous job (mutex held): now if the loop delivered its
 * reply already, else the loop does it right after the reply (gpu_async_cb). */
static void gpu_async_finish_locked(struct gpu_backend *b, struct backend_job *job)
{
	job->kernel_done = true;
	if (job->reply_delivered) {
		job->enqueued = false;
		backend_job_append(&b->done_head, &b->done_tail, job);
	}
}

/* Finish every asynchronous job still in flight with st (mutex held; the caller wakes the
 * loop): the fatal path, and a close that waited long enough. Their host functions, if they
 * ever run, find the ticket abandoned. */
static void gpu_abandon_tickets_locked(struct gpu_backend *b, fa_status st, const char *why)
{
	while (b->tickets != NULL) {
		struct gpu_ticket *t = b->tickets;
		b->tickets = t->next;
		t->abandoned = true;
		t->prev = t->next = NULL;
		t->job->status = st;
		snprintf(t->job->detail, sizeof t->job->detail, "%s", why);
		gpu_async_finish_locked(b, t->job);
		t->job = NULL;
	}
	b->ntickets = 0;
}

/* The context is lost (mutex held): mark the fault (fault.c; the first why wins), fail everything
 * queued on every device, wake the loop, which reports it to the server. */
static void gpu_fatal_locked(struct gpu_backend *b, const char *why)
{
	fault_mark(&b->base, why);
	for (unsigned i = 0; i < b->ndevs; i++) {
		struct gpu_dev *d = &b->devs[i];
		while (d->run_head != NULL) {
			struct backend_job *job = d->run_head;
			d->run_head = job->next;
			gpu_finish_locked(b, job, FA_EDEVICE, "the GPU faulted while serving an "
			                  "earlier request; the daemon restarts with a clean context");
		}
		d->run_tail = NULL;
	}
	gpu_fail_waiting_locked(b, NULL, FA_EDEVICE, "the GPU faulted while serving an earlier "
	                        "request; the daemon restarts with a clean context");
	gpu_abandon_tickets_locked(b, FA_EDEVICE, "the GPU faulted while this asynchronous "
	                           "request ran or waited; its output is undefined");
	uv_async_send(&b->async);
}

/* ---- one job ------------------------------------------------------------------------------------ */

/* A failed driver call inside a job: FA_EDEVICE with the driver's text; *sticky when the context
 * is lost. Out of device memory is FA_ENOMEM. */
static fa_status gpu_job_cuerr(struct gpu_dev *d, struct backend_job *job, gpu_res r,
                               const char *what, bool *sticky)
{
	*sticky = gpu_sticky(r);
	snprintf(job->detail, sizeof job->detail, "%s on GPU %d: CUDA error %d (%s)%s", what,
	         d->ordinal, r, gpu_errstr(d->b, r),
	         *sticky ? "; the context is lost, the daemon restarts" : "");
	return r == 2 ? FA_ENOMEM : FA_EDEVICE;
}

/* Make the scratch at least `need` bytes (the stream is idle between jobs). */
static gpu_res gpu_scratch(struct gpu_dev *d, size_t need)
{
	struct gpu_cu *cu = &d->b->cu;
	size_t size = d->scratch_size > 0 ? d->scratch_size : GPU_SCRATCH_MIN;
	gpu_res r;

	if (need <= d->scratch_size)
		return 0;
	while (size < need)
		size += size / 2;
	if (d->scratch != 0)
		cu->MemFree(d->scratch);
	d->scratch = 0;
	d->scratch_size = 0;
	if ((r = cu->MemAlloc(&d->scratch, size)) != 0) {
		d->scratch = 0;
		return r;
	}
	d->scratch_size = size;
	return 0;
}

/* Enqueue one synchronous job on `stream` (host tensors: copies in, the kernel, copies out) and
 * record ev after it, also after a failure (copies may be queued). Sets job->status, detail and
 * *sticky on a failure to enqueue; gpu_complete waits. */
static void gpu_enqueue(struct gpu_dev *d, struct backend_job *job, gpu_stream stream, gpu_event ev,
                        bool *sticky)
{
	struct gpu_cu *cu = &d->b->cu;
	const struct fa_attn_fwd_desc *ds = &job->desc;
	size_t es = fa_dtype_size(ds->dtype);
	const void *ptr[5] = {job->q, job->k, job->v, job->o, job->lse};
	int n = job->lse != NULL ? 5 : 4;
	int64_t shape[5][4] = {{ds->B, ds->Sq, ds->Hq, ds->D},
	                       {ds->B, ds->Sk, ds->Hkv, ds->D},
	                       {ds->B, ds->Sk, ds->Hkv, ds->D},
	                       {ds->B, ds->Sq, ds->Hq, ds->D},
	                       {ds->B, ds->Hq, ds->Sq, 1}};
	int64_t stride[5][4];
	const int64_t *st3[5] = {ds->q_stride, ds->k_stride, ds->v_stride, ds->o_stride,
	                         ds->lse_stride};
	uint64_t ext[5] = {0}, off[5] = {0}, total = 0;
	gpu_ptr dp[5] = {0};
	size_t bytes_in = 0, bytes_out = 0;
	gpu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	/* Where each tensor is on the device: its own address, or a slice of the scratch. */
	for (int i = 0; i < n; i++) {
		memcpy(stride[i], st3[i], 3 * sizeof(int64_t));
		stride[i][3] = 1;
		if (job->on_device[i]) {
			dp[i] = (gpu_ptr)(uintptr_t)ptr[i];
			continue;
		}
		fa_tensor_extent(4, shape[i], stride[i], i == 4 ? sizeof(float) : es, NULL,
		                 &ext[i]); /* validated: cannot overflow */
		off[i] = total;
		total += (ext[i] + GPU_SCRATCH_ALIGN - 1) / GPU_SCRATCH_ALIGN * GPU_SCRATCH_ALIGN;
	}
	if (total > 0) {
		if ((r = gpu_scratch(d, (size_t)total)) != 0) {
			job->status = gpu_job_cuerr(d, job, r, "allocating device scratch for host "
			                            "buffers", sticky);
			return;
		}
		for (int i = 0; i < n; i++)
			if (!job->on_device[i])
				dp[i] = d->scratch + off[i];
	}
	/* Inputs in; outputs too when their extent has holes (strided), so the copy back leaves
	 * the bytes between their elements as they were. */
	for (int i = 0; i < n; i++) {
		if (job->on_device[i])
			continue;
		bool output = i >= 3;
		uint64_t dense = i == 4 ? (uint64_t)(ds->B * ds->Hq * ds->Sq) * sizeof(float)
		                        : (uint64_t)(shape[i][0] * shape[i][1] * shape[i][2] *
		                                     shape[i][3]) * es;
		if (output && ext[i] == dense)
			continue;
		if ((r = cu->MemcpyHtoDAsync(dp[i], ptr[i], ext[i], stream)) != 0) {
			job->status = gpu_job_cuerr(d, job, r, "copying a host tensor to the GPU",
			                            sticky);
			goto sync;
		}
		bytes_in += ext[i];
	}
	st = fa_gpu_attn_fwd(d->g, ds, dp[0], dp[1], dp[2], dp[3], n == 5 ? dp[4] : 0,
	                     (CUstream)stream, job->detail, sizeof job->detail);
	if (st != FA_OK) {
		job->status = st;
		goto sync;
	}
	for (int i = 3; i < n; i++) {
		if (job->on_device[i])
			continue;
		if ((r = cu->MemcpyDtoHAsync((void *)(uintptr_t)ptr[i], dp[i], ext[i],
		                             stream)) != 0) {
			job->status = gpu_job_cuerr(d, job, r, "copying a result to host memory",
			                            sticky);
			goto sync;
		}
		bytes_out += ext[i];
	}
sync:
	if ((r = cu->EventRecord(ev, stream)) != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "recording the job's event", sticky);
	job->bytes_in = bytes_in;
	job->bytes_out = bytes_out;
}

/* Wait for a job gpu_enqueue enqueued (its event) and classify what the device says. */
static void gpu_complete(struct gpu_dev *d, struct backend_job *job, gpu_event ev, bool *sticky)
{
	struct gpu_cu *cu = &d->b->cu;
	gpu_res r;

	/* A fault of the kernel shows here (errors of earlier asynchronous work come back from
	 * the next synchronising call). */
	r = cu->EventSynchronize(ev);
	if (r != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "running attention", sticky);
	else if (r != 0 && gpu_sticky(r))
		*sticky = true;
	/* A launch failure reported by fa_gpu as FA_EDEVICE: ask the context whether it is
	 * lost (sticky errors come back from every call). */
	if (job->status == FA_EDEVICE && !*sticky && (r = cu->CtxSynchronize()) != 0 &&
	    gpu_sticky(r))
		*sticky = true;
	pthread_mutex_lock(&d->b->mu);
	d->b->h2d_bytes += job->bytes_in;
	if (job->status == FA_OK)
		d->b->d2h_bytes += job->bytes_out;
	pthread_mutex_unlock(&d->b->mu);
}

/* ---- background tuning (device 0's worker) ------------------------------------------------- */

/* The tuner finished (worker, mutex NOT held): log the outcome, free it, have the table saved.
 * Returns whether a winner was stored. */
static bool gpu_tune_finish(struct gpu_backend *b, fa_status st, const char *why)
{
	struct fa_tune_entry e;
	int fails = 0;
	bool ok = fa_tuner_result(b->tuner, &e, &fails);

	if (ok) {
		char kb[96], hb[48], tb[48];
		fa_tune_key_format(&e.key, kb, sizeof kb);
		fa_tile_format(&e.heur, hb, sizeof hb);
		fa_tile_format(&e.best, tb, sizeof tb);
		log_notice("gpu: tuned %s: heuristic %s %.1f us, tuned %s %.1f us (%d candidates, "
		           "%d failed)", kb, hb, e.heur_us, tb, e.best_us, e.candidates, fails);
		char err[256];
		/* with compile threads, one of them saves (file I/O and fsync off the worker) */
		if (b->ncompile == 0 && fa_tune_table_save(b->tune, err, sizeof err) != FA_OK)
			log_warn("gpu: saving the tuning table: %s", err);
	} else {
		log_info("gpu: tuning a class stored nothing: %s", st != FA_OK ? why : "no result");
	}
	fa_tuner_free(b->tuner);
	b->tuner = NULL;
	return ok;
}

/* One idle turn of d's worker (mutex held, queue empty, not stopping): one tuning step, or
 * starting the next class. Returns true when it did something (the caller re-checks its queue:
 * a client job waits at most one step), false when there is nothing to do (the caller sleeps;
 * the compile threads wake it when a class' candidates are compiled). Never holds the mutex
 * across CUDA work. */
static bool gpu_tune_turn_locked(struct gpu_dev *d)
{
	struct gpu_backend *b = d->b;
	char why[FA_PROTO_DETAIL_MAX];
	fa_status st;

	if (!b->tune_idle || d != &b->devs[0] || fault_marked(&b->base))
		return false;
	why[0] = '\0';
	if (b->tuner != NULL) {
		bool done = false;
		pthread_mutex_unlock(&b->mu);
		st = fa_tuner_step(b->tuner, GPU_TUNE_SLICE_US, &done, why, sizeof why);
		/* a timed candidate may have poisoned the context: the next client job would find
		 * it, but say so now */
		gpu_res r = st == FA_EDEVICE ? b->cu.CtxSynchronize() : 0;
		bool ok = done && gpu_tune_finish(b, st, why);
		pthread_mutex_lock(&b->mu);
		if (r != 0 && gpu_sticky(r)) {
			gpu_fatal_locked(b, "the GPU faulted while tuning kernels in the background");
			return false;
		}
		if (done) {
			if (ok) {
				b->tuned++;
				b->tune_save = true;
				pthread_cond_broadcast(&b->compile_cv);
			} else {
				b->tune_failed++;
			}
		}
		return true;
	}
	if (b->tune_prepping) {
		if (b->tune_left > 0)
			return false; /* the compile threads wake us */
		b->tune_prepping = false;
		struct fa_attn_fwd_desc desc = b->tune_desc;
		pthread_mutex_unlock(&b->mu);
		st = fa_tuner_start(&b->tuner, b->tune, &desc, &b->tune_ops, NULL, why, sizeof why);
		if (st != FA_OK) {
			b->tuner = NULL;
			log_info("gpu: cannot tune a class: %s", why);
		}
		pthread_mutex_lock(&b->mu);
		if (st != FA_OK)
			b->tune_failed++;
		return true;
	}
	/* Plain CPU work (the table's own lock, the planner): fine under the mutex. */
	struct fa_tune_key k;
	if (!fa_tune_table_next_wanted(b->tune, &k))
		return false;
	int n = 0;
	fa_tune_key_desc(&k, &b->tune_desc);
	st = fa_gpu_plan(d->g, &b->tune_desc, b->tune_tiles, FA_TUNE_DEFAULT_CANDIDATES, &n, why,
	                 sizeof why);
	if (st != FA_OK || n <= 0) {
		b->tune_failed++;
		return true;
	}
	b->tune_ntiles = n;
	b->tune_next = 0;
	/* without compile threads the tuner's own prepare step compiles, on this thread */
	b->tune_left = b->ncompile > 0 ? n : 0;
	b->tune_prepping = true;
	pthread_cond_broadcast(&b->compile_cv);
	return true;
}

/* ---- compile threads ------------------------------------------------------------------------ */

/* A compile thread: prepare the oldest waiting specialisation, then move its jobs to the worker
 * (or answer them with the compile's failure); with nothing waiting, compile a tuning candidate
 * or save the tuning table (lowest priority: one unit at a time, so a client's compile waits for
 * at most one unit on each thread). */
static void *gpu_compiler(void *arg)
{
	struct gpu_backend *b = arg;
	char err[FA_PROTO_DETAIL_MAX];

	/* fa_gpu_prepare makes the right context current itself; this covers anything else */
	b->cu.CtxSetCurrent(b->devs[0].ctx);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		struct compile_wait *w = NULL;
		int ti = -1;
		bool save = false;
		while (!b->stopping && (w = compile_table_take(&b->waiting)) == NULL) {
			if (b->tune_prepping && b->tune_next < b->tune_ntiles) {
				ti = b->tune_next++;
				break;
			}
			if (b->tune_save) {
				b->tune_save = false;
				save = true;
				break;
			}
			pthread_cond_wait(&b->compile_cv, &b->mu);
		}
		if (w == NULL && ti < 0 && !save)
			break; /* stopping */
		struct fa_attn_fwd_desc desc = w != NULL ? w->desc : b->tune_desc;
		/* jobs compile for their device; tuning candidates for device 0 */
		struct gpu_dev *d = &b->devs[w != NULL && w->dev >= 0 ? w->dev : 0];
		struct fa_tile tile;
		if (ti >= 0)
			tile = b->tune_tiles[ti];
		pthread_mutex_unlock(&b->mu);

		fa_status st = FA_OK;
		err[0] = '\0';
		if (save)
			st = fa_tune_table_save(b->tune, err, sizeof err);
		else
			st = fa_gpu_prepare(d->g, &desc, ti >= 0 ? &tile : NULL, err, sizeof err);

		pthread_mutex_lock(&b->mu);
		if (save) {
			if (st != FA_OK)
				log_warn("gpu: saving the tuning table: %s", err);
			continue;
		}
		if (ti >= 0) {
			/* a candidate that fails is dropped by the tuner's own prepare step */
			if (--b->tune_left == 0)
				pthread_cond_broadcast(&b->cv);
			continue;
		}
		b->compiles++;
		if (st != FA_OK)
			b->compiles_failed++;
		struct backend_job *job = compile_table_finish(&b->waiting, w);
		bool woke = false;
		while (job != NULL) {
			struct backend_job *next = job->next;
			if (b->stopping) {
				/* the worker may be gone: never queue behind it now */
				gpu_finish_locked(b, job, FA_ECLOSED, "the daemon is shutting down");
				woke = true;
			} else if (st == FA_OK || st == FA_EDEVICE) {
				/* FA_EDEVICE: the worker retries and classifies the driver's error
				 * (a lost context is the fatal path) exactly as before the pool */
				gpu_queue_locked(d, job);
			} else {
				b->fwd_failed++;
				gpu_finish_locked(b, job, st, err);
				woke = true;
			}
			job = next;
		}
		pthread_cond_broadcast(&b->cv);
		if (woke)
			uv_async_send(&b->async);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* ---- asynchronous mode ------------------------------------------------------------------------ */

/* The host function queued behind an asynchronous job's kernel (a driver thread: no CUDA calls
 * here): the kernel finished, its regions can go. */
static void gpu_async_done(void *arg)
{
	struct gpu_ticket *t = arg;
	struct gpu_backend *b = t->b;

	pthread_mutex_lock(&b->mu);
	if (!t->abandoned) {
		if (t->prev != NULL)
			t->prev->next = t->next;
		else
			b->tickets = t->next;
		if (t->next != NULL)
			t->next->prev = t->prev;
		b->ntickets--;
		t->job->compute_ns = util_now_ns() - t->t0;
		b->fwd_ok++;
		gpu_async_finish_locked(b, t->job);
		uv_async_send(&b->async);
		pthread_cond_broadcast(&b->cv); /* gpu_close may wait for the last ticket */
	}
	pthread_mutex_unlock(&b->mu);
	free(t);
}

/* Run an asynchronous job: wait for the client's event on the session's stream, launch, record
 * the daemon's event, queue the host function. FA_OK: enqueued (the caller hands it back for the
 * reply); else the job failed before its kernel was enqueued (handed back once). */
static fa_status gpu_run_async(struct gpu_owner_dev *od, struct backend_job *job, bool *sticky)
{
	struct gpu_dev *d = od->d;
	struct gpu_backend *b = d->b;
	struct gpu_cu *cu = &b->cu;
	const struct fa_attn_fwd_desc *ds = &job->desc;
	uint64_t prof[3] = {0};
	gpu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	__typeof__(od->slot[0]) *sl = &od->slot[job->slot];
	if (job->has_wait_event) {
		/* Opened once per (session, slot, handle): the client keeps one event per slot. */
		if (sl->wait != NULL && memcmp(sl->wait_handle, job->wait_event, 64) != 0) {
			cu->EventDestroy(sl->wait);
			sl->wait = NULL;
		}
		if (sl->wait == NULL) {
			struct gpu_ipc_event h;
			memcpy(h.reserved, job->wait_event, sizeof h.reserved);
			if ((r = cu->IpcOpenEventHandle(&sl->wait, h)) != 0) {
				sl->wait = NULL;
				*sticky = gpu_sticky(r);
				snprintf(job->detail, sizeof job->detail,
				         "the client's CUDA IPC event cannot be opened on GPU %d: CUDA "
				         "error %d (%s); it must come from cuIpcGetEventHandle of an "
				         "event created with CU_EVENT_INTERPROCESS | "
				         "CU_EVENT_DISABLE_TIMING on that GPU",
				         d->ordinal, r, gpu_errstr(b, r));
				return job->status = *sticky ? FA_EDEVICE : FA_EINVAL;
			}
			memcpy(sl->wait_handle, job->wait_event, 64);
		}
		uint64_t tw = util_now_ns();
		if ((r = cu->StreamWaitEvent(od->stream, sl->wait, 0)) != 0)
			return job->status = gpu_job_cuerr(d, job, r, "waiting for the client's event",
			                                   sticky);
		prof[0] = util_now_ns() - tw;
	}
	if (sl->done == NULL) {
		struct gpu_ipc_event h;
		r = cu->EventCreate(&sl->done, GPU_EVENT_DISABLE_TIMING | GPU_EVENT_INTERPROCESS);
		if (r == 0 && (r = cu->IpcGetEventHandle(&h, sl->done)) != 0) {
			cu->EventDestroy(sl->done);
		}
		if (r != 0) {
			sl->done = NULL;
			return job->status = gpu_job_cuerr(d, job, r, "creating the completion event",
			                                   sticky);
		}
		memcpy(sl->done_handle, h.reserved, 64);
	}
	struct gpu_ticket *t = calloc(1, sizeof *t);
	if (t == NULL) {
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return job->status = FA_ENOMEM;
	}
	t->b = b;
	t->job = job;
	t->t0 = util_now_ns();
	uint64_t tl = t->t0;
	st = fa_gpu_attn_fwd(d->g, ds, (CUdeviceptr)(uintptr_t)job->q, (CUdeviceptr)(uintptr_t)job->k,
	                     (CUdeviceptr)(uintptr_t)job->v, (CUdeviceptr)(uintptr_t)job->o,
	                     (CUdeviceptr)(uintptr_t)job->lse, (CUstream)od->stream, job->detail,
	                     sizeof job->detail);
	if (st != FA_OK) {
		free(t);
		if (st == FA_EDEVICE && (r = cu->CtxSynchronize()) != 0 && gpu_sticky(r))
			*sticky = true;
		return job->status = st;
	}
	uint64_t tr = util_now_ns();
	prof[1] = tr - tl;
	if ((r = cu->EventRecord(sl->done, od->stream)) != 0) {
		free(t);
		return job->status = gpu_job_cuerr(d, job, r, "recording the completion event",
		                                   sticky);
	}
	memcpy(job->done_event, sl->done_handle, 64);
	prof[2] = util_now_ns() - tr;
	/* Ticket first: the host function may run before LaunchHostFunc returns. */
	pthread_mutex_lock(&b->mu);
	for (int i = 0; i < 3; i++)
		b->async_ns[i] += prof[i];
	t->next = b->tickets;
	if (b->tickets != NULL)
		b->tickets->prev = t;
	b->tickets = t;
	b->ntickets++;
	b->async_enqueued++;
	job->enqueued = true;
	job->kernel_done = job->reply_delivered = false;
	backend_job_append(&b->done_head, &b->done_tail, job); /* the reply */
	pthread_mutex_unlock(&b->mu);
	uint64_t th = util_now_ns();
	r = cu->LaunchHostFunc(od->stream, gpu_async_done, t);
	th = util_now_ns() - th;
	pthread_mutex_lock(&b->mu);
	b->async_ns[3] += th;
	pthread_mutex_unlock(&b->mu);
	if (r != 0) {
		/* Rare: finish it here, after the kernel, on this thread. */
		gpu_res r2 = cu->StreamSynchronize(od->stream);
		log_warn("gpu: cuLaunchHostFunc: CUDA error %d (%s); waited instead", r,
		         gpu_errstr(b, r));
		if (r2 != 0 && gpu_sticky(r2))
			*sticky = true;
		gpu_async_done(t);
	}
	uv_async_send(&b->async);
	return FA_OK;
}

static void gpu_job_done_locked(struct gpu_backend *b, struct backend_job *job, bool sticky);

/* A session's asynchronous thread on one device: its jobs, in order (see gpu_owner_dev). */
static void *gpu_owner_thread(void *arg)
{
	struct gpu_owner_dev *od = arg;
	struct gpu_backend *b = od->d->b;

	b->cu.CtxSetCurrent(od->d->ctx);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		while (od->head == NULL && !od->stop)
			pthread_cond_wait(&od->cv, &b->mu);
		struct backend_job *job = od->head;
		if (job == NULL)
			break;
		od->head = job->next;
		if (od->head == NULL)
			od->tail = NULL;
		job->next = NULL;
		if (fault_marked(&b->base)) {
			gpu_finish_locked(b, job, FA_EDEVICE, fault_why(&b->base));
			uv_async_send(&b->async);
			continue;
		}
		pthread_mutex_unlock(&b->mu);
		bool sticky = false;
		uint64_t t0 = util_now_ns();
		fa_status st = gpu_run_async(od, job, &sticky);
		pthread_mutex_lock(&b->mu);
		if (st != FA_OK) {
			job->compute_ns = util_now_ns() - t0;
			gpu_job_done_locked(b, job, sticky);
		} else if (sticky) {
			gpu_fatal_locked(b, "the GPU faulted while enqueuing an asynchronous job");
		}
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* This session's resources on d, created on first use (worker). NULL with job's status set. */
static struct gpu_owner_dev *gpu_owner_dev(struct gpu_dev *d, struct backend_job *job)
{
	struct gpu_backend *b = d->b;
	struct gpu_owner *o;
	unsigned i = (unsigned)(d - b->devs);
	gpu_res r;

	pthread_mutex_lock(&b->mu); /* two devices' workers may both create the session's state */
	o = *job->owner_state;
	if (o == NULL && (o = calloc(1, sizeof *o)) != NULL)
		*job->owner_state = o;
	pthread_mutex_unlock(&b->mu);
	if (o == NULL) {
		job->status = FA_ENOMEM;
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return NULL;
	}
	if (o->dev[i] != NULL)
		return o->dev[i];
	struct gpu_owner_dev *od = calloc(1, sizeof *od);
	if (od == NULL) {
		job->status = FA_ENOMEM;
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return NULL;
	}
	od->d = d;
	if ((r = b->cu.StreamCreate(&od->stream, 1 /* CU_STREAM_NON_BLOCKING */)) != 0) {
		bool sticky;
		job->status = gpu_job_cuerr(d, job, r, "creating the session's stream", &sticky);
		free(od);
		return NULL;
	}
	pthread_cond_init(&od->cv, NULL);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rv = pthread_create(&od->thread, NULL, gpu_owner_thread, od);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rv != 0) {
		job->status = FA_ESYS;
		snprintf(job->detail, sizeof job->detail, "starting the session's GPU thread: %s",
		         strerror(rv));
		pthread_cond_destroy(&od->cv);
		b->cu.StreamDestroy(od->stream);
		free(od);
		return NULL;
	}
	o->dev[i] = od;
	return od;
}



/* The loop frees a session: release its streams and events on every device. Every job of it
 * was handed back for good, so nothing of it is queued; destroying a stream or an event with
 * work pending is allowed (the driver releases them when the work completes). */
static void gpu_owner_free(struct backend *base, void *state)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	struct gpu_owner *o = state;

	for (unsigned i = 0; i < b->ndevs && o != NULL; i++) {
		struct gpu_owner_dev *od = o->dev[i];
		if (od == NULL)
			continue;
		pthread_mutex_lock(&b->mu);
		od->stop = true; /* idle: every job of the session was handed back */
		pthread_cond_signal(&od->cv);
		pthread_mutex_unlock(&b->mu);
		pthread_join(od->thread, NULL);
		pthread_cond_destroy(&od->cv);
		b->cu.CtxSetCurrent(b->devs[i].ctx);
		for (int k = 0; k < FA_PROTO_MAX_SLOTS; k++) {
			if (od->slot[k].done != NULL)
				b->cu.EventDestroy(od->slot[k].done);
			if (od->slot[k].wait != NULL)
				b->cu.EventDestroy(od->slot[k].wait);
		}
		b->cu.StreamDestroy(od->stream);
		free(od);
	}
	free(o);
}

/* ---- the canary ----------------------------------------------------------------------------------- */

/* Prepare d's canary: a causal fp16 attention of 32 tokens at D=64 on fixed pseudo-random
 * inputs, its float64 reference, device buffers, and the kernel (compiled or loaded from the
 * disk cache now, so the worker never compiles for it). */
static fa_status gpu_canary_init(struct gpu_dev *d, char *err, size_t errlen)
{
	struct gpu_cu *cu = &d->b->cu;
	struct fa_attn_fwd_desc *c = &d->canary_desc;
	const int64_t S = 32, D = 64;
	size_t n = (size_t)(S * D);
	uint16_t *host;
	uint32_t x = 0x9e3779b9u;
	gpu_res r;
	fa_status st;

	memset(c, 0, sizeof *c);
	c->dtype = FA_DTYPE_FP16;
	c->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	c->scale = 0.125;
	c->B = 1;
	c->Sq = c->Sk = S;
	c->Hq = c->Hkv = 1;
	c->D = D;
	for (int i = 0; i < 3; i++) {
		int64_t st3[3] = {S * D, D, D};
		memcpy(c->q_stride, st3, sizeof st3);
		memcpy(c->k_stride, st3, sizeof st3);
		memcpy(c->v_stride, st3, sizeof st3);
		memcpy(c->o_stride, st3, sizeof st3);
	}
	d->canary_bytes = n * sizeof(uint16_t);
	if ((host = malloc(3 * d->canary_bytes)) == NULL ||
	    (d->canary_ref = malloc(n * sizeof(double))) == NULL ||
	    (d->canary_out = malloc(d->canary_bytes)) == NULL) {
		free(host);
		return util_fail(err, errlen, FA_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < 3 * n; i++) {
		x = x * 1664525u + 1013904223u;
		host[i] = fa_float_to_half((float)((double)(x >> 8) / (double)(1u << 24) * 2.0 - 1.0));
	}
	st = fa_attn_fwd_ref64(c, host, host + n, host + 2 * n, d->canary_ref, NULL);
	if (st != FA_OK) {
		free(host);
		return util_fail(err, errlen, st, "the canary's reference failed");
	}
	if ((r = cu->MemAlloc(&d->canary_mem, 4 * d->canary_bytes)) != 0) {
		d->canary_mem = 0;
		free(host);
		return util_fail(err, errlen, r == 2 ? FA_ENOMEM : FA_ENOGPU,
		                 "GPU %d: allocating the canary: CUDA error %d (%s)", d->ordinal, r,
		                 gpu_errstr(d->b, r));
	}
	r = cu->MemcpyHtoDAsync(d->canary_mem, host, 3 * d->canary_bytes, d->stream);
	if (r == 0)
		r = cu->StreamSynchronize(d->stream);
	free(host);
	if (r != 0)
		return util_fail(err, errlen, FA_ENOGPU, "GPU %d: uploading the canary: CUDA error "
		                 "%d (%s)", d->ordinal, r, gpu_errstr(d->b, r));
	/* An explicit tile: the canary must not count as (or queue) a class for the tuner. */
	int nt = 0;
	if ((st = fa_gpu_plan(d->g, c, &d->canary_tile, 1, &nt, err, errlen)) != FA_OK)
		return st;
	if (nt < 1)
		return util_fail(err, errlen, FA_ENOFIT, "no tile for the canary");
	if ((st = fa_gpu_prepare(d->g, c, &d->canary_tile, err, errlen)) != FA_OK)
		return st;
	atomic_store(&d->canary_ok_ns, util_now_ns());
	return FA_OK;
}

/* Run the canary on d's stream and check it (worker, mutex not held). Returns whether it
 * passed; *sticky when the context is lost; *wrong when it computed a wrong result. */
static bool gpu_canary_run(struct gpu_dev *d, bool *sticky, bool *wrong, char *why, size_t whylen)
{
	struct gpu_cu *cu = &d->b->cu;
	gpu_ptr q = d->canary_mem, k = q + d->canary_bytes, v = k + d->canary_bytes,
	        o = v + d->canary_bytes;
	double e = INFINITY;
	gpu_res r;
	fa_status st;

	*sticky = *wrong = false;
	d->canary_last_ns = util_now_ns();
	r = cu->MemsetD8Async(o, 0xff, d->canary_bytes, d->stream); /* NaN: never passes */
	if (r == 0) {
		st = fa_gpu_attn_fwd_tile(d->g, &d->canary_desc, &d->canary_tile, q, k, v, o, 0,
		                          (CUstream)d->stream, why, whylen);
		if (st != FA_OK)
			r = -1;
	} else {
		snprintf(why, whylen, "cuMemsetD8Async: CUDA error %d (%s)", r, gpu_errstr(d->b, r));
	}
	if (r == 0 && (r = cu->MemcpyDtoHAsync(d->canary_out, o, d->canary_bytes, d->stream)) != 0)
		snprintf(why, whylen, "cuMemcpyDtoHAsync: CUDA error %d (%s)", r, gpu_errstr(d->b, r));
	gpu_res rs = cu->StreamSynchronize(d->stream);
	if (rs != 0) {
		*sticky = gpu_sticky(rs);
		if (r == 0)
			snprintf(why, whylen, "the canary kernel: CUDA error %d (%s)", rs,
			         gpu_errstr(d->b, rs));
		r = rs;
	} else if (r == -1 && (rs = cu->CtxSynchronize()) != 0 && gpu_sticky(rs)) {
		*sticky = true;
	}
	if (r == 0) {
		e = fa_attn_fwd_rel_error(&d->canary_desc, d->canary_out, d->canary_ref);
		if (!(e <= GPU_CANARY_TOL)) {
			*wrong = true;
			snprintf(why, whylen, "the canary computed a wrong result on GPU %d: relative "
			         "error %.3g (tolerance %.0e)", d->ordinal, e, GPU_CANARY_TOL);
		}
	}
	bool ok = r == 0 && !*wrong;
	pthread_mutex_lock(&d->b->mu);
	d->canary_runs++;
	d->canary_err = e;
	if (!ok)
		d->canary_failed++;
	pthread_mutex_unlock(&d->b->mu);
	if (ok)
		atomic_store(&d->canary_ok_ns, util_now_ns());
	return ok;
}

/* The canary's turn on d's worker (mutex held on entry and exit): run it when it is due. A
 * wrong result or a lost context is the fatal path; another failure only stops the canary's
 * passes (the watchdog starves after GPU_CANARY_STALE_NS). Returns whether it ran. */
static bool gpu_canary_turn_locked(struct gpu_dev *d)
{
	struct gpu_backend *b = d->b;
	char why[FA_PROTO_DETAIL_MAX];
	bool sticky, wrong;

	if (d->canary_mem == 0 || fault_marked(&b->base) ||
	    util_now_ns() - d->canary_last_ns < GPU_CANARY_EVERY_NS)
		return false;
	pthread_mutex_unlock(&b->mu);
	why[0] = '\0';
	bool ok = gpu_canary_run(d, &sticky, &wrong, why, sizeof why);
	pthread_mutex_lock(&b->mu);
	if (!ok) {
		log_err("gpu: GPU %d: canary failed: %s", d->ordinal, why);
		if (sticky || wrong)
			gpu_fatal_locked(b, why);
	}
	return true;
}

/* ---- the worker ----------------------------------------------------------------------------- */

/* Whether the job stages a tensor through the device scratch (a host-memory region). */
static bool gpu_job_stages_host(const struct backend_job *job)
{
	for (int i = 0; i < 5; i++)
		if (!job->on_device[i] && (i < 4 || job->lse != NULL))
			return true;
	return false;
}

/* The job's FLOPs, 4*B*Hq*Sq*Sk*D (the masked half counted too: a bound, for the latency
 * policies below). */
static double gpu_job_flop(const struct backend_job *job)
{
	const struct fa_attn_fwd_desc *ds = &job->desc;
	return 4.0 * (double)ds->B * (double)ds->Hq * (double)ds->Sq * (double)ds->Sk *
	       (double)ds->D;
}

/* Take up to GPU_PIPE synchronous jobs off d's queue (mutex held): device-memory jobs, and at
 * most one that stages host memory (the scratch is one), which ends the batch. An asynchronous
 * job at the head is taken alone (n = 1, returned in out[0]). */
static unsigned gpu_take_batch_locked(struct gpu_dev *d, struct backend_job **out)
{
	unsigned n = 0;

	while (d->run_head != NULL && n < GPU_PIPE) {
		struct backend_job *job = d->run_head;
		bool host = gpu_job_stages_host(job);
		if (job->async && n > 0)
			break;
		d->run_head = job->next;
		if (d->run_head == NULL)
			d->run_tail = NULL;
		job->next = NULL;
		out[n++] = job;
		if (job->async || host)
			break;
	}
	return n;
}

/* Hand a finished job back (mutex held). */
static void gpu_job_done_locked(struct gpu_backend *b, struct backend_job *job, bool sticky)
{
	job->t_done = util_now_ns();
	if (job->status == FA_OK)
		b->fwd_ok++;
	else
		b->fwd_failed++;
	backend_job_append(&b->done_head, &b->done_tail, job);
	if (sticky)
		gpu_fatal_locked(b, job->detail);
	uv_async_send(&b->async);
}

/* A device's worker: take jobs, enqueue them back to back, hand each back as its event
 * completes; between batches and when idle, the canary and (device 0) tuning steps. */
static void *gpu_worker(void *arg)
{
	struct gpu_dev *d = arg;
	struct gpu_backend *b = d->b;
	struct backend_job *batch[GPU_PIPE];
	uint64_t t0[GPU_PIPE];

	bool spin = false;

	b->cu.CtxSetCurrent(d->ctx);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		gpu_canary_turn_locked(d);
		while (d->run_head == NULL && !b->stopping) {
			if (gpu_canary_turn_locked(d) || gpu_tune_turn_locked(d))
				continue;
			if (spin) {
				unsigned seen = atomic_load(&d->pushes);
				uint64_t until = util_now_ns() + GPU_SPIN_NS;
				spin = false;
				pthread_mutex_unlock(&b->mu);
				while (atomic_load(&d->pushes) == seen && util_now_ns() < until)
					gpu_relax();
				pthread_mutex_lock(&b->mu);
				continue;
			}
			/* idle: wake for the next canary at the latest */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&b->cv, &b->mu, &ts);
		}
		if (d->run_head == NULL)
			break; /* stopping, and nothing left */
		unsigned n = gpu_take_batch_locked(d, batch);
		spin = true;
		d->busy = true;
		if (fault_marked(&b->base)) {
			for (unsigned i = 0; i < n; i++)
				gpu_finish_locked(b, batch[i], FA_EDEVICE, fault_why(&b->base));
			d->busy = false;
			uv_async_send(&b->async);
			continue;
		}
		atomic_fetch_add(&b->base.running, n);
		pthread_mutex_unlock(&b->mu);

		bool sticky = false;
		if (batch[0]->async) {
			/* to the session's own thread (created here on first use) */
			struct backend_job *job = batch[0];
			struct gpu_owner_dev *od = gpu_owner_dev(d, job);
			pthread_mutex_lock(&b->mu);
			d->busy = false;
			atomic_fetch_sub(&b->base.running, 1);
			if (od == NULL) {
				gpu_job_done_locked(b, job, false);
				continue;
			}
			backend_job_append(&od->head, &od->tail, job);
			pthread_cond_signal(&od->cv);
			continue;
		}
		for (unsigned i = 0; i < n; i++) {
			bool s1 = false;
			t0[i] = util_now_ns();
			batch[i]->t_pick = t0[i];
			gpu_enqueue(d, batch[i], d->stream, d->pipe_ev[i], &s1);
			sticky |= s1;
		}
		for (unsigned i = 0; i < n; i++) {
			bool s1 = false;
			gpu_complete(d, batch[i], d->pipe_ev[i], &s1);
			if (i + 1 == n) {
				pthread_mutex_lock(&b->mu);
				d->busy = false;
				pthread_mutex_unlock(&b->mu);
			}
			batch[i]->compute_ns = util_now_ns() - t0[i];
			pthread_mutex_lock(&b->mu);
			atomic_fetch_sub(&b->base.running, 1);
			gpu_job_done_locked(b, batch[i], s1 || (sticky && i + 1 == n));
			pthread_mutex_unlock(&b->mu);
		}
		pthread_mutex_lock(&b->mu);
	}
	pthread_mutex_unlock(&b->mu);
	if (b->tuner != NULL && d == &b->devs[0]) { /* stopping mid-class: nothing stored */
		fa_tuner_free(b->tuner);
		b->tuner = NULL;
	}
	return NULL;
}

/* ---- loop side ------------------------------------------------------------------------------------ */

/* On the loop: hand finished jobs back (an asynchronous job's first hand-back is its reply; its
 * second follows at once when the kernel already finished); then report a fault to the server
 * (fault.c). */
static void gpu_async_cb(uv_async_t *h)
{
	struct gpu_backend *b = h->data;
	struct backend_job *job;

	pthread_mutex_lock(&b->mu);
	job = b->done_head;
	b->done_head = b->done_tail = NULL;
	pthread_mutex_unlock(&b->mu);
	while (job != NULL) {
		struct backend_job *next = job->next;
		job->next = NULL;
		if (job->enqueued) {
			b->done(job, b->done_arg); /* the reply; the job stays */
			pthread_mutex_lock(&b->mu);
			job->reply_delivered = true;
			bool fin = job->kernel_done;
			pthread_mutex_unlock(&b->mu);
			if (fin) {
				job->enqueued = false;
				b->done(job, b->done_arg);
			}
		} else {
			if (job->loop_spin) {
				job->loop_spin = false;
				if (--b->spin_jobs == 0)
					uv_idle_stop(&b->spin);
			}
			if (job->t_pick != 0 && job->t_done != 0) {
				uint64_t now = util_now_ns();
				pthread_mutex_lock(&b->mu);
				b->lat_ns[0] += job->t_pick - job->t_submit;
				b->lat_ns[1] += job->t_done - job->t_pick;
				b->lat_ns[2] += now - job->t_done;
				b->lat_n++;
				pthread_mutex_unlock(&b->mu);
			}
			b->done(job, b->done_arg);
		}
		job = next;
	}
	fault_check(&b->base);
}

/* Run a small synchronous device-memory job on the loop thread when d's worker is idle and the
 * kernel is loaded: no hand-off to the worker and back (tens of microseconds of a tiny request's
 * latency). Returns whether it ran (then it is on the done list, answered this loop turn). */
static bool gpu_try_inline(struct gpu_backend *b, struct gpu_dev *d, struct backend_job *job)
{
	if (job->async || d->inline_stream == NULL || gpu_job_flop(job) > GPU_INLINE_MAX_FLOP ||
	    job->fault_injected || fault_marked(&b->base) || gpu_job_stages_host(job))
		return false;
	pthread_mutex_lock(&b->mu);
	bool idle = !b->stopping && !d->busy && d->run_head == NULL;
	if (idle)
		atomic_fetch_add(&b->base.running, 1);
	pthread_mutex_unlock(&b->mu);
	if (!idle)
		return false;
	bool sticky = false, s2 = false;
	uint64_t t0 = util_now_ns();
	b->cu.CtxSetCurrent(d->ctx);
	gpu_enqueue(d, job, d->inline_stream, d->inline_ev, &sticky);
	gpu_complete(d, job, d->inline_ev, &s2);
	job->compute_ns = util_now_ns() - t0;
	pthread_mutex_lock(&b->mu);
	b->lat_ns[3] += job->compute_ns;
	atomic_fetch_sub(&b->base.running, 1);
	d->inline_jobs++;
	gpu_job_done_locked(b, job, sticky || s2);
	pthread_mutex_unlock(&b->mu);
	return true;
}

/* The idle handle's callback: nothing; while it is started the loop polls without sleeping. */
static void gpu_spin_cb(uv_idle_t *h)
{
	(void)h;
}

/* Queue a job on its device: the one of its device buffers, else round robin. */
static fa_status gpu_submit(struct backend *base, struct backend_job *job)
{
	struct gpu_backend *b = (struct gpu_backend *)base;

	if (job->dev < 0 || (unsigned)job->dev >= b->ndevs)
		job->dev = (int)(b->rr++ % b->ndevs);
	struct gpu_dev *d = &b->devs[job->dev];

	job->status = FA_OK;
	job->compute_ns = 0;
	job->detail[0] = '\0';
	job->enqueued = job->kernel_done = job->reply_delivered = false;
	job->t_submit = util_now_ns();
	job->t_pick = job->t_done = 0;
	job->loop_spin = false;
	/* A kernel not loaded yet is compiled by a compile thread while the worker serves other
	 * jobs. The query is cheap and CPU-only; when it fails (the planner refuses the shape)
	 * the worker's launch reports the same error. */
	bool ready = true, known = false;
	char key[COMPILE_KEY_MAX], why[FA_PROTO_DETAIL_MAX];
	int kl = snprintf(key, sizeof key, "g%d/", job->dev);
	if (b->ncompile > 0 && !fault_marked(&b->base)) {
		known = fa_gpu_kernel_lookup(d->g, &job->desc, &ready, key + kl,
		                             sizeof key - (size_t)kl, why, sizeof why) == FA_OK;
		if (!known)
			ready = true;
	}
	/* the loop never compiles: only a kernel known to be loaded runs inline */
	if (known && ready && gpu_try_inline(b, d, job))
		return FA_OK;
	bool spin = b->spin_open && !job->async && gpu_job_flop(job) <= GPU_LOOP_SPIN_MAX_FLOP;
	pthread_mutex_lock(&b->mu);
	if (b->stopping) {
		pthread_mutex_unlock(&b->mu);
		return FA_ECLOSED;
	}
	bool is_new = false;
	if (ready || compile_table_add(&b->waiting, key, job, &is_new) != FA_OK) {
		gpu_queue_locked(d, job); /* ENOMEM too: it compiles there */
		pthread_cond_broadcast(&b->cv);
	} else {
		b->compile_jobs++;
		spin = false; /* a compile takes milliseconds to seconds: no point spinning */
		if (is_new)
			pthread_cond_signal(&b->compile_cv);
	}
	job->loop_spin = spin; /* before the unlock: the job may come back at once */
	pthread_mutex_unlock(&b->mu);
	if (spin && b->spin_jobs++ == 0)
		uv_idle_start(&b->spin, gpu_spin_cb);
	return FA_OK;
}

/* Hand back, with status st, the queued jobs of owner (all when NULL) not started yet. */
static unsigned gpu_cancel(struct backend *base, const void *owner, fa_status st,
                           const char *why)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	unsigned n = 0;

	pthread_mutex_lock(&b->mu);
	for (unsigned i = 0; i < b->ndevs; i++) {
		struct gpu_dev *d = &b->devs[i];
		struct backend_job **pp = &d->run_head, *prev = NULL;
		while (*pp != NULL) {
			struct backend_job *job = *pp;
			if (owner == NULL || job->owner == owner) {
				*pp = job->next;
				if (d->run_tail == job)
					d->run_tail = prev;
				gpu_finish_locked(b, job, st, why);
				n++;
				continue;
			}
			prev = job;
			pp = &job->next;
		}
	}
	n += gpu_fail_waiting_locked(b, owner, st, why);
	if (n > 0)
		uv_async_send(&b->async);
	pthread_mutex_unlock(&b->mu);
	return n;
}

/* Healthy while no fault poisoned a context and every device's canary passed within
 * GPU_CANARY_STALE_NS (a worker stuck in a kernel, or a canary that keeps failing, starves the
 * watchdog and systemd restarts the daemon). */
static bool gpu_healthy(struct backend *base)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	uint64_t now = util_now_ns();

	if (fault_marked(base))
		return false;
	for (unsigned i = 0; i < b->ndevs; i++) {
		uint64_t ok = atomic_load(&b->devs[i].canary_ok_ns);
		if (now > ok && now - ok > GPU_CANARY_STALE_NS)
			return false;
	}
	return true;
}

/* The last reference of a region served here: close the IPC mapping or unpin the host pages. */
static void gpu_region_release(struct region *r)
{
	struct gpu_backend *b = r->backend;
	gpu_res res;

	b->cu.CtxSetCurrent(b->devs[r->dev >= 0 ? r->dev : 0].ctx);
	if (r->kind == FA_REGION_CUDA_IPC) {
		if (r->base != NULL &&
		    (res = b->cu.IpcCloseMemHandle((gpu_ptr)(uintptr_t)r->base)) != 0)
			log_info("region %016" PRIx64 ": cuIpcCloseMemHandle: CUDA error %d (%s)",
			         r->id, res, gpu_errstr(b, res));
	} else if ((res = b->cu.MemHostUnregister(r->base)) != 0) {
		log_info("region %016" PRIx64 ": cuMemHostUnregister: CUDA error %d (%s)", r->id,
		         res, gpu_errstr(b, res));
	}
	r->release = NULL;
}

/* A new region: pin host memory, or open a CUDA IPC handle (once) after checking its GPU. */
static fa_status gpu_region_open(struct backend *base, struct region *r,
                                 const uint8_t *ipc_handle, const uint8_t *gpu_uuid, char *err,
                                 size_t errlen)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	struct gpu_dev *d = &b->devs[0];
	gpu_res res;

	if (fault_marked(&b->base))
		return util_fail(err, errlen, FA_EDEVICE, "the GPU faulted; the daemon restarts");
	/* Device memory: the device whose UUID the client named. */
	for (unsigned i = 0; gpu_uuid != NULL && i < b->ndevs; i++)
		if (memcmp(gpu_uuid, b->devs[i].uuid, 16) == 0)
			d = &b->devs[i];
	b->cu.CtxSetCurrent(d->ctx);
	if (r->kind == FA_REGION_HOST_SHM) {
		/* Portable: any context may copy from it (several devices later). */
		if ((res = b->cu.MemHostRegister(r->base, (size_t)r->size, 1)) != 0)
			return util_fail(err, errlen, res == 2 ? FA_ENOMEM : FA_ESYS,
			                 "pinning the %" PRIu64 "-byte host buffer %s for the GPU "
			                 "(cuMemHostRegister): CUDA error %d (%s)",
			                 r->size, r->name, res, gpu_errstr(b, res));
		r->backend = b;
		r->release = gpu_region_release;
		return FA_OK;
	}
	if (memcmp(gpu_uuid, d->uuid, 16) != 0) {
		char want[48], got[48];
		gpu_uuid_text(d->uuid, want);
		gpu_uuid_text(gpu_uuid, got);
		if (b->ndevs == 1)
			return util_fail(err, errlen, FA_ENOTSUP,
			                 "the buffer is on GPU %s; this daemon serves GPU %s (%s) only",
			                 got, want, fa_gpu_name(d->g));
		return util_fail(err, errlen, FA_ENOTSUP,
		                 "the buffer is on GPU %s, which is not one of this daemon's %u GPUs "
		                 "(GPU 0 is %s; CUDA_VISIBLE_DEVICES decides which it sees)",
		                 got, b->ndevs, want);
	}
	struct gpu_ipc_handle h;
	gpu_ptr p = 0, abase = 0;
	size_t asize = 0;
	memcpy(h.reserved, ipc_handle, sizeof h.reserved);
	res = b->cu.IpcOpenMemHandle(&p, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */);
	if (res != 0) {
		if (gpu_sticky(res)) {
			pthread_mutex_lock(&b->mu);
			gpu_fatal_locked(b, "cuIpcOpenMemHandle lost the context");
			pthread_mutex_unlock(&b->mu);
			return util_fail(err, errlen, FA_EDEVICE,
			                 "cuIpcOpenMemHandle: CUDA error %d (%s)", res,
			                 gpu_errstr(b, res));
		}
		return util_fail(err, errlen, res == 2 ? FA_ENOMEM : FA_EINVAL,
		                 "the CUDA IPC handle cannot be opened: CUDA error %d (%s); it must "
		                 "come from cuIpcGetMemHandle of a live cudaMalloc allocation of "
		                 "another process on %s",
		                 res, gpu_errstr(b, res), fa_gpu_name(d->g));
	}
	/* The handle maps the whole allocation: it must hold what the client declared. */
	res = b->cu.MemGetAddressRange(&abase, &asize, p);
	if (res != 0 || (uint64_t)asize < r->size) {
		b->cu.IpcCloseMemHandle(p);
		if (res != 0)
			return util_fail(err, errlen, FA_EINVAL,
			                 "cuMemGetAddressRange on the opened handle: CUDA error %d (%s)",
			                 res, gpu_errstr(b, res));
		return util_fail(err, errlen, FA_ERANGE,
		                 "the CUDA allocation behind the handle has %zu bytes, the "
		                 "registration declares %" PRIu64,
		                 asize, r->size);
	}
	r->base = (void *)(uintptr_t)p;
	r->backend = b;
	r->release = gpu_region_release;
	r->dev = (int)(d - b->devs);
	return FA_OK;
}

/* "# gpu" section of STATS. */
static void gpu_stats(struct backend *base, char *buf, size_t cap)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	struct gpu_dev *d = &b->devs[0];
	char uuid[48];
	uint64_t ok, failed, h2d, d2h, compiles, compiles_failed, compile_jobs, tuned, tune_failed;
	unsigned waiting_jobs, waiting_kernels;
	bool tuning;

	pthread_mutex_lock(&b->mu);
	compiles = b->compiles;
	compiles_failed = b->compiles_failed;
	compile_jobs = b->compile_jobs;
	waiting_jobs = b->waiting.jobs;
	waiting_kernels = b->waiting.entries;
	tuned = b->tuned;
	tune_failed = b->tune_failed;
	tuning = b->tune_prepping || b->tuner != NULL; /* tuner: read racily, for STATS only */
	ok = b->fwd_ok;
	failed = b->fwd_failed;
	h2d = b->h2d_bytes;
	d2h = b->d2h_bytes;
	uint64_t async_enq = b->async_enqueued, canary_runs = 0, canary_failed = 0, inl = 0;
	for (unsigned i = 0; i < b->ndevs; i++)
		inl += b->devs[i].inline_jobs;
	uint64_t ans[4], lat[4], latn = b->lat_n;
	memcpy(ans, b->async_ns, sizeof ans);
	memcpy(lat, b->lat_ns, sizeof lat);
	unsigned async_running = b->ntickets;
	double canary_err = 0;
	for (unsigned i = 0; i < b->ndevs; i++) {
		canary_runs += b->devs[i].canary_runs;
		canary_failed += b->devs[i].canary_failed;
		if (b->devs[i].canary_err > canary_err)
			canary_err = b->devs[i].canary_err;
	}
	pthread_mutex_unlock(&b->mu);
	uint64_t now = util_now_ns(), canary_age = 0;
	for (unsigned i = 0; i < b->ndevs; i++) {
		uint64_t t = atomic_load(&b->devs[i].canary_ok_ns);
		if (now > t && now - t > canary_age)
			canary_age = now - t;
	}
	gpu_uuid_text(d->uuid, uuid);
	struct fa_gpu_cache_stats cs;
	fa_gpu_cache_stats(d->g, &cs);
	int n = snprintf(buf, cap,
	         "# gpu\ngpu_devices:%u\ngpu_name:%s\ngpu_uuid:%s\ngpu_sm:%d\ngpu_smem_optin:%zu\n"
	         "gpu_faulted:%d\ngpu_fwd_ok:%" PRIu64 "\ngpu_fwd_failed:%" PRIu64
	         "\ngpu_host_h2d_bytes:%" PRIu64 "\ngpu_host_d2h_bytes:%" PRIu64 "\n",
	         b->ndevs, fa_gpu_name(d->g), uuid, fa_gpu_sm(d->g), fa_gpu_smem_optin(d->g),
	         fault_marked(&b->base) ? 1 : 0, ok, failed, h2d, d2h);
	if (n < 0 || (size_t)n >= cap)
		return;
	int m = snprintf(buf + n, cap - (size_t)n,
	         "gpu_compile_threads:%u\ngpu_compile_waiting_jobs:%u\ngpu_compile_waiting_kernels:%u"
	         "\ngpu_compiles:%" PRIu64 "\ngpu_compiles_failed:%" PRIu64
	         "\ngpu_compile_jobs_waited:%" PRIu64 "\n",
	         b->ncompile, waiting_jobs, waiting_kernels, compiles, compiles_failed, compile_jobs);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	m = snprintf(buf + n, cap - (size_t)n,
	             "gpu_inline_jobs:%" PRIu64 "\ngpu_inline_us_total:%" PRIu64
	             "\ngpu_worker_jobs:%" PRIu64 "\ngpu_worker_us_to_pick:%" PRIu64
	             "\ngpu_worker_us_to_done:%" PRIu64 "\ngpu_worker_us_to_loop:%" PRIu64
	             "\ngpu_async_enqueued:%" PRIu64 "\ngpu_async_running:%u\ngpu_async_host_us_wait:%"
	             PRIu64 "\ngpu_async_host_us_launch:%" PRIu64 "\ngpu_async_host_us_record:%" PRIu64
	             "\ngpu_async_host_us_hostfn:%" PRIu64 "\ngpu_canary_runs:%" PRIu64
	             "\ngpu_canary_failed:%" PRIu64 "\ngpu_canary_age_ms:%" PRIu64
	             "\ngpu_canary_worst_err:%.3g\n",
	             inl, lat[3] / 1000, latn, lat[0] / 1000, lat[1] / 1000, lat[2] / 1000,
	             async_enq, async_running, ans[0] / 1000, ans[1] / 1000, ans[2] / 1000,
	             ans[3] / 1000, canary_runs, canary_failed, canary_age / 1000000,
	             canary_err);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	for (unsigned i = 1; i < b->ndevs; i++) { /* GPU 0 is described above */
		char u[48];
		gpu_uuid_text(b->devs[i].uuid, u);
		m = snprintf(buf + n, cap - (size_t)n, "gpu%u_name:%s\ngpu%u_uuid:%s\n", i,
		             fa_gpu_name(b->devs[i].g), i, u);
		if (m < 0 || (size_t)m >= cap - (size_t)n)
			return;
		n += m;
	}
	struct fa_tune_stats ts;
	memset(&ts, 0, sizeof ts);
	if (b->tune != NULL)
		fa_tune_table_stats(b->tune, &ts);
	m = snprintf(buf + n, cap - (size_t)n,
	             "# tuning\ntune_mode:%s\ntune_table:%s\ntune_entries:%d\ntune_loaded:%d"
	             "\ntune_corrupt:%d\ntune_stale:%d\ntune_hits:%" PRIu64 "\ntune_misses:%" PRIu64
	             "\ntune_unfit:%" PRIu64 "\ntune_tuned:%" PRIu64 "\ntune_failed:%" PRIu64
	             "\ntune_active:%d\n",
	             b->tune_idle ? "idle" : "off",
	             b->tune == NULL ? "none" : fa_tune_table_path(b->tune)[0] ? fa_tune_table_path(b->tune) : "memory",
	             ts.entries, ts.loaded, ts.corrupt, ts.stale ? 1 : 0, ts.hits, ts.misses,
	             ts.unfit, tuned, tune_failed, tuning ? 1 : 0);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	snprintf(buf + n, cap - (size_t)n,
	         "# kernels\nkernels_loaded:%" PRIu64 "\nkernels_mem_hits:%" PRIu64
	         "\nkernels_disk_loads:%" PRIu64 "\nkernels_compiled:%" PRIu64
	         "\nkernels_disk_stores:%" PRIu64 "\nkernels_disk_errors:%" PRIu64
	         "\nkernels_compile_ms_total:%.1f\nkernels_compile_ms_last:%.1f\nkernels_compile_last:%s"
	         "\nkernels_disk_cache:%s\n",
	         cs.kernels, cs.mem_hits, cs.disk_loads, cs.compiled, cs.disk_stores, cs.disk_errors,
	         cs.compile_ms_total, cs.compile_ms_last, cs.compile_last,
	         cs.disk_enabled ? cs.disk_dir : "off");
}

/* ---- open / close ---------------------------------------------------------------------------- */

/* Release a device's resources (its worker has stopped). */
static void gpu_dev_fini(struct gpu_backend *b, struct gpu_dev *d)
{
	if (d->ctx != NULL) {
		b->cu.CtxSetCurrent(d->ctx);
		if (d->scratch != 0)
			b->cu.MemFree(d->scratch);
		if (d->canary_mem != 0)
			b->cu.MemFree(d->canary_mem);
		for (int i = 0; i < GPU_PIPE; i++)
			if (d->pipe_ev[i] != NULL)
				b->cu.EventDestroy(d->pipe_ev[i]);
		if (d->inline_ev != NULL)
			b->cu.EventDestroy(d->inline_ev);
		if (d->inline_stream != NULL)
			b->cu.StreamDestroy(d->inline_stream);
		if (d->stream != NULL)
			b->cu.StreamDestroy(d->stream);
		b->cu.DevicePrimaryCtxRelease(d->cudev);
	}
	fa_gpu_close(d->g);
	free(d->canary_ref);
	free(d->canary_out);
	memset(d, 0, sizeof(*d));
}

/* Free everything (workers stopped, async closed or never opened). */
static void gpu_free(struct gpu_backend *b)
{
	/* the tuner's scratch buffers need the device; the table outlives its last user */
	if (b->tune_ops_ok)
		fa_tune_gpu_ops_fini(&b->tune_ops);
	if (b->tune != NULL) {
		if (b->devs[0].g != NULL)
			fa_gpu_set_tune_table(b->devs[0].g, NULL);
		fa_tune_table_close(b->tune);
	}
	compile_table_fini(&b->waiting);
	pthread_cond_destroy(&b->compile_cv);
	for (unsigned i = 0; i < b->ndevs; i++)
		gpu_dev_fini(b, &b->devs[i]);
	if (b->cu.lib != NULL)
		dlclose(b->cu.lib);
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	free(b);
}

/* A loop handle is closed: the last one releases the backend. */
static void gpu_handle_closed(uv_handle_t *h)
{
	struct gpu_backend *b = h->data;
	void (*closed)(void *) = b->closed;
	void *arg = b->closed_arg;

	if (--b->handles_open > 0)
		return;
	gpu_free(b);
	if (closed != NULL)
		closed(arg);
}

/* Stop the workers after their queues drain, deliver what finished, close the handle. */
static void gpu_close(struct backend *base, void (*closed)(void *arg), void *arg)
{
	struct gpu_backend *b = (struct gpu_backend *)base;

	pthread_mutex_lock(&b->mu);
	b->stopping = true;
	/* jobs still waiting for a compile are answered now; a compile in progress runs to its end
	 * (the join below waits for it, at most one compile) and finds no jobs */
	if (gpu_fail_waiting_locked(b, NULL, FA_ECLOSED, "the daemon is shutting down") > 0)
		uv_async_send(&b->async);
	pthread_cond_broadcast(&b->cv);
	pthread_cond_broadcast(&b->compile_cv);
	pthread_mutex_unlock(&b->mu);
	for (unsigned i = 0; i < b->ncompile; i++)
		pthread_join(b->compile_thr[i], NULL);
	for (unsigned i = 0; i < b->ndevs; i++)
		if (b->devs[i].thread_started)
			pthread_join(b->devs[i].thread, NULL);
	/* Asynchronous kernels still running (the server drained, so normally none): wait a
	 * bounded time for their host functions, then finish them as abandoned. */
	pthread_mutex_lock(&b->mu);
	uint64_t until = util_now_ns() + GPU_CLOSE_WAIT_NS;
	while (b->tickets != NULL && util_now_ns() < until) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&b->cv, &b->mu, &ts);
	}
	if (b->tickets != NULL) {
		log_warn("gpu: %u asynchronous kernels did not finish within %llu s of the close; "
		         "answering them FA_ECLOSED", b->ntickets,
		         (unsigned long long)(GPU_CLOSE_WAIT_NS / 1000000000ull));
		gpu_abandon_tickets_locked(b, FA_ECLOSED, "the daemon closed before the kernel "
		                           "finished");
	}
	pthread_mutex_unlock(&b->mu);
	gpu_async_cb(&b->async); /* every job is handed back exactly once */
	b->closed = closed;
	b->closed_arg = arg;
	if (b->spin_open) {
		uv_idle_stop(&b->spin);
		uv_close((uv_handle_t *)&b->spin, gpu_handle_closed);
	}
	uv_close((uv_handle_t *)&b->async, gpu_handle_closed);
}

/* The kernels library's reports (disk-cache trouble, compile times) into the daemon's log. */
static void gpu_kernels_log(void *ctx, int level, const char *msg)
{
	(void)ctx;
	LOG_AT(level, "kernels: %s", msg);
}

/* Open one device: fa_gpu (driver, NVRTC, primary context, kernel disk cache), a stream. */
static fa_status gpu_dev_open(struct gpu_backend *b, struct gpu_dev *d, int ordinal,
                              const struct config *cfg, char *err, size_t errlen)
{
	char why[256];
	fa_status st;
	gpu_res r;

	d->b = b;
	d->ordinal = ordinal;
	if ((st = fa_gpu_open(&d->g, ordinal, &cfg->kernels, err, errlen)) != FA_OK)
		return st;
	fa_gpu_set_log(d->g, gpu_kernels_log, NULL);
	/* A warm restart loads every kernel it compiled before from here; a cache that cannot be
	 * used only costs compile time, so it never stops the daemon. */
	if (cfg->cache_dir[0] != '\0' &&
	    fa_gpu_set_cache_dir(d->g, cfg->cache_dir, why, sizeof why) != FA_OK)
		log_warn("gpu: kernel disk cache off: %s", why);
	if (b->cu.lib == NULL && (st = gpu_load_driver(&b->cu, err, errlen)) != FA_OK)
		return st;
	fa_gpu_uuid(d->g, d->uuid);
	if ((r = b->cu.DeviceGet(&d->cudev, ordinal)) != 0 ||
	    (r = b->cu.DevicePrimaryCtxRetain(&d->ctx, d->cudev)) != 0) {
		d->ctx = NULL;
		return util_fail(err, errlen, FA_ENOGPU, "GPU %d: primary context: CUDA error %d (%s)",
		                 ordinal, r, gpu_errstr(b, r));
	}
	b->cu.CtxSetCurrent(d->ctx);
	if ((r = b->cu.StreamCreate(&d->stream, 1 /* CU_STREAM_NON_BLOCKING */)) != 0) {
		d->stream = NULL;
		return util_fail(err, errlen, FA_ENOGPU, "GPU %d: cuStreamCreate: CUDA error %d (%s)",
		                 ordinal, r, gpu_errstr(b, r));
	}
	if ((r = b->cu.StreamCreate(&d->inline_stream, 1)) != 0 ||
	    (r = b->cu.EventCreate(&d->inline_ev, GPU_EVENT_DISABLE_TIMING)) != 0) {
		/* only a latency optimisation: carry on without it */
		log_warn("gpu: GPU %d: no stream for small jobs on the loop: CUDA error %d (%s)",
		         ordinal, r, gpu_errstr(b, r));
		if (d->inline_stream != NULL)
			b->cu.StreamDestroy(d->inline_stream);
		d->inline_stream = NULL;
		d->inline_ev = NULL;
	}
	for (int i = 0; i < GPU_PIPE; i++)
		if ((r = b->cu.EventCreate(&d->pipe_ev[i], GPU_EVENT_DISABLE_TIMING)) != 0) {
			d->pipe_ev[i] = NULL;
			return util_fail(err, errlen, FA_ENOGPU,
			                 "GPU %d: cuEventCreate: CUDA error %d (%s)", ordinal, r,
			                 gpu_errstr(b, r));
		}
	return gpu_canary_init(d, err, errlen);
}

/* The tuning table (after the disk cache dir is set, before any thread uses the device): loaded
 * from <cache dir>/tuning, handed to fa_gpu so launches use tuned tiles. Failures only cost the
 * tuning: logged, and the heuristic serves. */
static void gpu_tune_open(struct gpu_backend *b, const struct config *cfg)
{
	struct gpu_dev *d = &b->devs[0];
	struct fa_tune_ident id;
	struct fa_tune_stats ts;
	char why[256];

	fa_tune_gpu_ident(d->g, &id);
	if (fa_tune_table_open(&b->tune, cfg->cache_dir[0] != '\0' ? cfg->cache_dir : NULL, &id,
	                       fa_gpu_model(d->g), 0, why, sizeof why) != FA_OK) {
		log_warn("gpu: tuning table off: %s", why);
		b->tune = NULL;
		return;
	}
	fa_tune_table_stats(b->tune, &ts);
	log_notice("gpu: tuning table %s: %d entries loaded, %d corrupt lines skipped%s%s",
	           fa_tune_table_path(b->tune)[0] ? fa_tune_table_path(b->tune) : "(memory)",
	           ts.loaded, ts.corrupt, ts.why[0] ? "; " : "", ts.why);
	fa_gpu_set_tune_table(d->g, b->tune);
	if (strcmp(cfg->tune, "off") == 0)
		return;
	if (fa_tune_gpu_ops_init(&b->tune_ops, d->g, why, sizeof why) != FA_OK) {
		log_warn("gpu: background tuning off: %s", why);
		return;
	}
	b->tune_ops_ok = true;
	b->tune_idle = true;
}

/* Start the GPU backend on GPU 0. FA_ENOGPU (with the reason) when there is none. */
static fa_status gpu_open(struct backend **out, uv_loop_t *loop, const struct config *cfg,
                          backend_done_fn done, void *arg, char *err, size_t errlen)
{
	struct gpu_backend *b;
	sigset_t all, old;
	fa_status st;
	int rv;

	*out = NULL;
	if ((b = calloc(1, sizeof(*b))) == NULL)
		return util_fail(err, errlen, FA_ENOMEM, "out of memory");
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	pthread_cond_init(&b->compile_cv, NULL);
	compile_table_init(&b->waiting);
	b->base.ops = &backend_gpu_ops;
	b->base.align = 16; /* fa_gpu.h: 16-byte pointers and batch/seq/head strides */
	b->base.host_memory = true;
	b->base.device_memory = true;
	b->loop = loop;
	b->done = done;
	b->done_arg = arg;
	/* fa_gpu_open first (in gpu_dev_open): its "no driver" text is the one worth showing. */
	b->base.async_events = true;
	b->ndevs = 1;
	st = gpu_dev_open(b, &b->devs[0], 0, cfg, err, errlen);
	if (st != FA_OK) {
		gpu_free(b);
		return st;
	}
	/* Every other visible device (CUDA_VISIBLE_DEVICES chooses): one that cannot be opened
	 * is left out with a warning, the others serve. */
	int count = 1;
	if (b->cu.DeviceGetCount(&count) != 0)
		count = 1;
	if (count > GPU_MAX_DEVICES) {
		log_warn("gpu: %d devices visible; serving the first %d", count, GPU_MAX_DEVICES);
		count = GPU_MAX_DEVICES;
	}
	for (int i = 1; i < count; i++) {
		char why[FA_PROTO_DETAIL_MAX];
		st = gpu_dev_open(b, &b->devs[b->ndevs], i, cfg, why, sizeof why);
		b->ndevs++; /* so gpu_free releases what it opened, also on failure */
		if (st != FA_OK) {
			log_warn("gpu: GPU %d left out: %s", i, why);
			gpu_dev_fini(b, &b->devs[--b->ndevs]);
		}
	}
	gpu_tune_open(b, cfg);
	if ((rv = uv_async_init(loop, &b->async, gpu_async_cb)) != 0) {
		gpu_free(b);
		return util_fail(err, errlen, FA_ESYS, "uv_async_init: %s", uv_strerror(rv));
	}
	b->async.data = b;
	b->async_open = true;
	b->handles_open = 1;
	if (uv_idle_init(loop, &b->spin) == 0) { /* only latency: carry on without it */
		b->spin.data = b;
		b->spin_open = true;
		b->handles_open++;
	}

	sigfillset(&all);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < b->ndevs; i++) {
		if ((rv = pthread_create(&b->devs[i].thread, NULL, gpu_worker, &b->devs[i])) != 0) {
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			util_fail(err, errlen, FA_ESYS, "starting the GPU %u worker: %s", i,
			          strerror(rv));
			gpu_close(&b->base, NULL, NULL);
			return FA_ESYS;
		}
		b->devs[i].thread_started = true;
	}
	unsigned want = cfg->compile_threads < 0 ? 0 : (unsigned)cfg->compile_threads;
	if (want > GPU_MAX_COMPILE_THREADS)
		want = GPU_MAX_COMPILE_THREADS;
	for (unsigned i = 0; i < want; i++) {
		/* fewer threads than asked only costs latency: carry on with what started */
		if ((rv = pthread_create(&b->compile_thr[i], NULL, gpu_compiler, b)) != 0) {
			log_warn("gpu: starting compile thread %u: %s", i, strerror(rv));
			break;
		}
		pthread_mutex_lock(&b->mu); /* gpu_submit reads it on the loop: same thread, but */
		b->ncompile = i + 1;        /* the compile threads read it under mu */
		pthread_mutex_unlock(&b->mu);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	b->base.threads = b->ndevs;
	for (unsigned i = 0; i < b->ndevs; i++)
		log_notice("backend: gpu on GPU %d (%s, sm_%d, %zu bytes of opt-in shared memory)",
		           b->devs[i].ordinal, fa_gpu_name(b->devs[i].g), fa_gpu_sm(b->devs[i].g),
		           fa_gpu_smem_optin(b->devs[i].g));
	*out = &b->base;
	return FA_OK;
}

const struct backend_ops backend_gpu_ops = {
	.name = "gpu",
	.kind = FA_BACKEND_GPU,
	.open = gpu_open,
	.submit = gpu_submit,
	.cancel = gpu_cancel,
	.close = gpu_close,
	.healthy = gpu_healthy,
	.region_open = gpu_region_open,
	.stats = gpu_stats,
	.owner_free = gpu_owner_free,
};
