/* bench_ipcmem.c - does the attention kernel run slower on memory another process exported than
 * on its own process's memory, and if so why (issue 12: 8 clients' kernels ran 0.445-0.451 ms in
 * the daemon against 0.413 back to back in one process; bench_ring's rotation anchor, run once
 * each in a fixed order, said 0.905x, 0.987x and 0.911x for imported memory).
 *
 *   bench_ipcmem [-r REPS] [-n LAUNCHES]   (default 6 repeats per phase, 300 launches a block)
 *
 * The kernel is bench_serving's 8-client request, bf16 B1 H16 S4096 D128 forward, launched back
 * to back over 8 tensor sets in turn (as the daemon's worker launches 8 clients' requests), every
 * set holding the same bytes. One importing process runs it on each kind of memory ("variant"):
 *
 *   local      8 cuMemAlloc of its own (the anchor)
 *   ipc        8 cuMemAlloc of the exporter's, legacy CUDA IPC (what the daemon maps today)
 *   ipc-2M     the same with each allocation's size rounded up to 2 MiB
 *   ipc-one    one exported cuMemAlloc holding the 8 sets at 2 MiB-aligned offsets, one handle
 *   vmm-local  8 cuMemCreate of its own, mapped at 2 MiB-aligned reserved addresses
 *   vmm-ipc    8 cuMemCreate of the exporter's, exported as POSIX fds (passed with SCM_RIGHTS),
 *              imported (cuMemImportFromShareableHandle) and mapped at 2 MiB-aligned addresses
 *   local-1    local's first set again and again; ipc-1: ipc's first set again and again
 *
 * A block is LAUNCHES launches with an event before each and after the last: the per-kernel
 * times (median) and the block's span (TFLOP/s); while the block runs the SM clock and the board
 * power are read through NVML (dlopen'ed libnvidia-ml.so.1; "no NVML" without it). The blocks
 * are interleaved: each repeat runs every variant once, the order rotated by one and reversed
 * every other repeat, so clocks, power and heat drifting over the run fall on every variant
 * alike; each variant's figures are medians over the repeats with their min..max, and its ratio
 * to local is taken in the same repeat (paired) before the median. Three phases: importer and
 * exporter alone, then with 8 more idle processes holding a CUDA context (as 8 clients' are),
 * then alone again. Per variant it prints each set's pointer modulo 2 MiB and 64 KiB in the
 * exporter and in the importer, the allocation's size, and what cuMemGetAddressRange and
 * cuPointerGetAttribute (range, mapping, handle types, legacy IPC capability) say in the
 * importer; after the run, each variant's O against local's, bit for bit.
 *
 * CUDA never in this process (the fork rule of bench_serving.c): the exporter, the importer and
 * the idle processes are forked children. Without a GPU it prints why and exits 0. Figures only;
 * exit 1 only when something failed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fa_cudrv.h"
#include "fa_gpu.h"
#include "fa_integ.h"
#include "fa_ksettings.h"

#define SETS 8
#define IDLE_CTX 8 /* phase 1's idle processes with a context */
#define PHASES 3
#define MAX_REPS 32
#define MAX_LAUNCHES 1000
#define MIB2 ((size_t)2 << 20)
#define KIB64 ((size_t)64 << 10)

static const struct fa_case rot1 = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 4096, .Sk = 4096,
                                    .Hq = 16, .Hkv = 16, .D = 128};

enum { V_LOCAL, V_IPC, V_IPC_2M, V_IPC_ONE, V_VMM_LOCAL, V_VMM_IPC, V_LOCAL_1, V_IPC_1, NVAR };
static const char *const var_name[NVAR] = {"local",     "ipc",     "ipc-2M",  "ipc-one",
                                           "vmm-local", "vmm-ipc", "local-1", "ipc-1"};

/* What the exporter makes: E_IPC (8 cuMemAlloc of the set's size), E_IPC_2M (rounded up to
 * 2 MiB), E_ONE (one allocation of 8 rounded sets), E_VMM (8 cuMemCreate, POSIX fds). */
enum { E_IPC, E_IPC_2M, E_ONE, E_VMM, NEXP };

/* One set as the importer sees it, and as the exporter made it. */
struct set_info {
	cu_ptr exp_ptr, imp_ptr;  /* the set's first byte in each process */
	size_t alloc;             /* the allocation (or VMM handle) it lies in, bytes */
	cu_ptr range_base;        /* cuMemGetAddressRange in the importer */
	size_t range_size;
	cu_ptr map_base;          /* CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR / _SIZE (0: refused) */
	size_t map_size;
	unsigned long long handle_types; /* CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES (-1: refused) */
	int legacy_ipc;                  /* IS_LEGACY_CUDA_IPC_CAPABLE (-1: refused) */
};

/* One block's figures. */
struct block {
	double med_ms, tflops, mhz, watts;
	unsigned temp_c;
	unsigned long long reasons; /* NVML's clock event (throttle) reasons, OR'ed */
};

struct var_res {
	struct set_info set[SETS];
	struct block b[PHASES][MAX_REPS];
	int same_bits; /* O of set 0 equals local's, byte for byte (1), differs (0), -1 unchecked */
};

struct board {
	char why[256];
	char nvml[128]; /* "": NVML read; else why not */
	struct fa_cu_ipc_handle h[NEXP][SETS];
	cu_ptr eptr[NEXP][SETS];
	size_t ealloc[NEXP][SETS];
	size_t set_bytes, set_round, granularity;
	volatile int exp_state;  /* 1: exported, 2: the importer is done (or gave up) */
	volatile int idle_want;  /* the importer: 1 start the idle contexts, 0 end them */
	volatile int idle_ready; /* idle processes holding a context */
	volatile int phase_go;   /* the parent: the phase the importer may run (-1: none yet) */
	volatile int phase_done; /* the importer: phases finished */
	int reps, launches, ok;
	struct var_res v[NVAR];
};

static struct board *B;
static char g_cache[64];
static int g_sock[2] = {-1, -1}; /* the exporter's end [0] and the importer's [1] */

static size_t round_up(size_t x, size_t a)
{
	return (x + a - 1) / a * a;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median of n values (sorted in place); min and max beside it. */
static double median(double *v, int n, double *lo, double *hi)
{
	qsort(v, (size_t)n, sizeof *v, cmpd);
	if (lo)
		*lo = v[0];
	if (hi)
		*hi = v[n - 1];
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- NVML, loaded at run time (the SM clock and power beside each block) --------------------- */

typedef void *nvml_dev;
static struct {
	int (*init)(void);
	int (*handle)(unsigned idx, nvml_dev *d);
	int (*clock)(nvml_dev d, int type, unsigned *mhz);
	int (*power)(nvml_dev d, unsigned *mw);
	int (*temp)(nvml_dev d, int sensor, unsigned *c);
	int (*reasons)(nvml_dev d, unsigned long long *r);
	nvml_dev dev;
	bool ok;
} nv;

static void nvml_open(void)
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		snprintf(B->nvml, sizeof B->nvml, "no NVML (libnvidia-ml.so.1 does not load)");
		return;
	}
	nv.init = (int (*)(void))(uintptr_t)dlsym(lib, "nvmlInit_v2");
	nv.handle = (int (*)(unsigned, nvml_dev *))(uintptr_t)dlsym(lib,
	                                                            "nvmlDeviceGetHandleByIndex_v2");
	nv.clock = (int (*)(nvml_dev, int, unsigned *))(uintptr_t)dlsym(lib, "nvmlDeviceGetClockInfo");
	nv.power = (int (*)(nvml_dev, unsigned *))(uintptr_t)dlsym(lib, "nvmlDeviceGetPowerUsage");
	nv.temp = (int (*)(nvml_dev, int, unsigned *))(uintptr_t)dlsym(lib,
	                                                               "nvmlDeviceGetTemperature");
	void *r = dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons");
	if (r == NULL)
		r = dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
	nv.reasons = (int (*)(nvml_dev, unsigned long long *))(uintptr_t)r;
	/* index 0: the benchmark's GPU is CUDA device 0 of a one-GPU host */
	if (!nv.init || !nv.handle || !nv.clock || nv.init() != 0 || nv.handle(0, &nv.dev) != 0) {
		snprintf(B->nvml, sizeof B->nvml, "no NVML (init or device 0 failed)");
		return;
	}
	nv.ok = true;
}

struct nv_acc {
	double mhz, mw;
	int n;
	unsigned temp;
	unsigned long long reasons;
};

static void nvml_sample(struct nv_acc *a)
{
	unsigned mhz = 0, mw = 0;
	unsigned long long r = 0;
	if (!nv.ok || nv.clock(nv.dev, 1 /* NVML_CLOCK_SM */, &mhz) != 0)
		return;
	if (nv.power && nv.power(nv.dev, &mw) == 0)
		a->mw += mw;
	if (nv.reasons && nv.reasons(nv.dev, &r) == 0)
		a->reasons |= r;
	a->mhz += mhz;
	a->n++;
}

/* ---- the exporter ------------------------------------------------------------------------------ */

/* The set's inputs (fa_case_fill, seed 7: every set the same bytes) written at p; the host
 * copy is made once per process. */
static int fill(cu_ptr p, const struct fa_case_layout *l)
{
	static void *h;
	if (h == NULL) {
		uint64_t rng = 7;
		CHECK((h = malloc(l->total)) != NULL, "malloc %zu", l->total);
		fa_case_fill(&rot1, l, h, &rng);
	}
	CHECK(cu.MemcpyHtoD(p, h, l->total) == 0, "upload %zu bytes", l->total);
	return 0;
}

static struct fa_cu_mem_prop vmm_prop(void)
{
	struct fa_cu_mem_prop p = {0};
	p.type = FA_CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requested_handle_types = FA_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p.location.type = FA_CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 0;
	return p;
}

/* A VMM allocation of bytes (a multiple of the granularity) mapped read-write at a reserved
 * range aligned to 2 MiB: h (made here when *h is 0, else imported by the caller) at *p. */
static int vmm_map(fa_cu_mem_handle *h, size_t bytes, cu_ptr *p)
{
	struct fa_cu_mem_prop prop = vmm_prop();
	struct fa_cu_mem_access acc = {.location = prop.location,
	                               .flags = FA_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	cu_res r;
	if (*h == 0)
		CHECK((r = cu.MemCreate(h, bytes, &prop, 0)) == 0, "cuMemCreate %zu: %d", bytes, r);
	CHECK((r = cu.MemAddressReserve(p, bytes, MIB2, 0, 0)) == 0, "cuMemAddressReserve: %d", r);
	CHECK((r = cu.MemMap(*p, bytes, 0, *h, 0)) == 0, "cuMemMap: %d", r);
	CHECK((r = cu.MemSetAccess(*p, bytes, &acc, 1)) == 0, "cuMemSetAccess: %d", r);
	return 0;
}

static void vmm_unmap(fa_cu_mem_handle h, size_t bytes, cu_ptr p)
{
	if (p != 0) {
		cu.MemUnmap(p, bytes);
		cu.MemAddressFree(p, bytes);
	}
	if (h != 0)
		cu.MemRelease(h);
}

/* SETS descriptors in one message (SCM_RIGHTS). */
static int send_fds(int sock, const int fds[SETS])
{
	char byte = 'f';
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	union {
		char buf[CMSG_SPACE(sizeof(int) * SETS)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                   .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * SETS);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * SETS);
	return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fds(int sock, int fds[SETS])
{
	char byte;
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	union {
		char buf[CMSG_SPACE(sizeof(int) * SETS)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                   .msg_controllen = sizeof u.buf};
	struct pollfd pfd = {.fd = sock, .events = POLLIN};
	if (poll(&pfd, 1, fa_test_ms(60000)) != 1 || recvmsg(sock, &m, 0) != 1)
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int) * SETS))
		return -1;
	memcpy(fds, CMSG_DATA(c), sizeof(int) * SETS);
	return 0;
}

static int export_all(cu_ptr mem[NEXP][SETS], fa_cu_mem_handle vh[SETS])
{
	char why[256];
	struct fa_case_layout l;
	struct fa_cu_mem_prop prop = vmm_prop();
	size_t gran = 0;
	int fds[SETS];
	cu_res r;

	CHECK(fa_cu_start(0, why, sizeof why) == 0, "CUDA: %s", why);
	fa_case_layout(&rot1, &l);
	CHECK(cu.MemGetAllocationGranularity(&gran, &prop, FA_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
	          == 0 && gran > 0, "cuMemGetAllocationGranularity");
	B->set_bytes = l.total;
	B->set_round = round_up(l.total, gran > MIB2 ? gran : MIB2);
	B->granularity = gran;
	const size_t rs = B->set_round;
	for (int i = 0; i < SETS; i++) {
		const size_t sz[2] = {l.total, rs};
		for (int k = E_IPC; k <= E_IPC_2M; k++) {
			CHECK((r = cu.MemAlloc(&mem[k][i], sz[k])) == 0, "cuMemAlloc %zu: %d", sz[k], r);
			CHECK(fill(mem[k][i], &l) == 0, "fill");
			CHECK(cu.IpcGetMemHandle(&B->h[k][i], mem[k][i]) == 0, "cuIpcGetMemHandle");
			B->eptr[k][i] = mem[k][i];
			B->ealloc[k][i] = sz[k];
		}
	}
	CHECK((r = cu.MemAlloc(&mem[E_ONE][0], rs * SETS)) == 0, "cuMemAlloc %zu: %d", rs * SETS,
	      r);
	CHECK(cu.IpcGetMemHandle(&B->h[E_ONE][0], mem[E_ONE][0]) == 0, "cuIpcGetMemHandle");
	for (int i = 0; i < SETS; i++) {
		CHECK(fill(mem[E_ONE][0] + i * rs, &l) == 0, "fill");
		B->eptr[E_ONE][i] = mem[E_ONE][0] + i * rs;
		B->ealloc[E_ONE][i] = rs * SETS;
	}
	for (int i = 0; i < SETS; i++) {
		CHECK(vmm_map(&vh[i], rs, &mem[E_VMM][i]) == 0, "vmm");
		CHECK(fill(mem[E_VMM][i], &l) == 0, "fill");
		CHECK((r = cu.MemExportToShareableHandle(&fds[i], vh[i],
		                                         FA_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		                                         0)) == 0, "cuMemExportToShareableHandle: %d", r);
		B->eptr[E_VMM][i] = mem[E_VMM][i];
		B->ealloc[E_VMM][i] = rs;
	}
	CHECK(cu.CtxSynchronize() == 0, "the uploads");
	CHECK(send_fds(g_sock[0], fds) == 0, "sendmsg SCM_RIGHTS: %s", strerror(errno));
	for (int i = 0; i < SETS; i++)
		close(fds[i]);
	return 0;
}

/* Every exported kind, handles on the board and fds to the importer, kept until the importer
 * is done (bounded). */
static int child_export(void)
{
	cu_ptr mem[NEXP][SETS] = {{0}};
	fa_cu_mem_handle vh[SETS] = {0};
	int rc = export_all(mem, vh);
	__atomic_store_n(&B->exp_state, rc == 0 ? 1 : 2, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 600000 && rc == 0 && B->exp_state != 2; i++)
		usleep(1000);
	for (int i = 0; i < SETS; i++) {
		if (mem[E_IPC][i])
			cu.MemFree(mem[E_IPC][i]);
		if (mem[E_IPC_2M][i])
			cu.MemFree(mem[E_IPC_2M][i]);
		vmm_unmap(vh[i], B->set_round, mem[E_VMM][i]);
	}
	if (mem[E_ONE][0])
		cu.MemFree(mem[E_ONE][0]);
	return rc;
}

/* ---- the idle processes (phase 1): a context each, nothing launched -------------------------- */

static int child_idle(void)
{
	char why[256];
	cu_ptr p = 0;
	CHECK(fa_cu_start(0, why, sizeof why) == 0 && cu.MemAlloc(&p, MIB2) == 0, "CUDA: %s", why);
	__atomic_fetch_add(&B->idle_ready, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 600000 && B->idle_want; i++)
		usleep(1000);
	cu.MemFree(p);
	return 0;
}

/* ---- the importer ---------------------------------------------------------------------------- */

struct imp {
	struct fa_gpu *g;
	struct fa_attn_fwd_desc d;
	struct fa_case_layout l;
	void *s;
	void *ev[MAX_LAUNCHES + 1];
	cu_ptr set[NVAR][SETS];
};

static fa_status launch(struct imp *im, cu_ptr m, char *err, size_t errlen)
{
	const struct fa_case_layout *l = &im->l;
	return fa_gpu_attn_fwd(im->g, &im->d, m + l->q_off, m + l->k_off, m + l->v_off,
	                       m + l->o_off, 0, (CUstream)im->s, err, errlen);
}

/* What the importer's driver says of a set's pointer. */
static void describe(struct set_info *si, cu_ptr p)
{
	unsigned long long v = 0;
	int cap = 0;
	si->imp_ptr = p;
	if (cu.MemGetAddressRange(&si->range_base, &si->range_size, p) != 0)
		si->range_base = 0, si->range_size = 0;
	si->map_base = cu.PointerGetAttribute(&v, FA_CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p) == 0
	                   ? (cu_ptr)v : 0;
	v = 0;
	si->map_size = cu.PointerGetAttribute(&v, FA_CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p) == 0
	                   ? (size_t)v : 0;
	v = 0;
	si->handle_types =
	    cu.PointerGetAttribute(&v, FA_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p) == 0 ? v
	                                                                                   : ~0ull;
	si->legacy_ipc =
	    cu.PointerGetAttribute(&cap, FA_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) == 0
	        ? cap : -1;
}

/* The variants' sets: local memory made here, the exporter's opened. */
static int open_sets(struct imp *im, cu_ptr own[SETS], fa_cu_mem_handle lvh[SETS],
                     cu_ptr *vmm_loc, cu_ptr ipc[2][SETS], cu_ptr *one,
                     fa_cu_mem_handle ivh[SETS], cu_ptr vmm_imp[SETS])
{
	int fds[SETS];
	const size_t rs = B->set_round;
	cu_res r;

	CHECK(recv_fds(g_sock[1], fds) == 0, "no descriptors from the exporter");
	for (int i = 0; i < SETS; i++) {
		CHECK((r = cu.MemAlloc(&own[i], B->set_bytes)) == 0, "cuMemAlloc: %d", r);
		CHECK(fill(own[i], &im->l) == 0, "fill");
		CHECK(vmm_map(&lvh[i], rs, &vmm_loc[i]) == 0, "vmm");
		CHECK(fill(vmm_loc[i], &im->l) == 0, "fill");
		for (int k = 0; k < 2; k++)
			CHECK((r = cu.IpcOpenMemHandle(&ipc[k][i], B->h[k][i],
			                               FA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) == 0,
			      "cuIpcOpenMemHandle: %d", r);
		CHECK((r = cu.MemImportFromShareableHandle(&ivh[i], (void *)(uintptr_t)fds[i],
		                                           FA_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		          == 0, "cuMemImportFromShareableHandle: %d", r);
		close(fds[i]);
		CHECK(vmm_map(&ivh[i], rs, &vmm_imp[i]) == 0, "vmm import");
	}
	CHECK((r = cu.IpcOpenMemHandle(one, B->h[E_ONE][0], FA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
	          == 0, "cuIpcOpenMemHandle (one): %d", r);
	CHECK(cu.CtxSynchronize() == 0, "the uploads");
	static const int from[NVAR] = {-1, E_IPC, E_IPC_2M, E_ONE, -1, E_VMM, -1, E_IPC};
	for (int i = 0; i < SETS; i++) {
		im->set[V_LOCAL][i] = own[i];
		im->set[V_IPC][i] = ipc[0][i];
		im->set[V_IPC_2M][i] = ipc[1][i];
		im->set[V_IPC_ONE][i] = *one + i * rs;
		im->set[V_VMM_LOCAL][i] = vmm_loc[i];
		im->set[V_VMM_IPC][i] = vmm_imp[i];
		im->set[V_LOCAL_1][i] = own[0];
		im->set[V_IPC_1][i] = ipc[0][0];
	}
	for (int v = 0; v < NVAR; v++)
		for (int i = 0; i < SETS; i++) {
			struct set_info *si = &B->v[v].set[i];
			describe(si, im->set[v][i]);
			if (from[v] >= 0) {
				int j = v == V_IPC_1 ? 0 : i;
				si->exp_ptr = B->eptr[from[v]][j];
				si->alloc = B->ealloc[from[v]][j];
			} else {
				si->exp_ptr = si->imp_ptr;
				si->alloc = v == V_VMM_LOCAL ? rs : B->set_bytes;
			}
		}
	return 0;
}

/* One block of variant v: B->launches launches over its sets in turn. */
static int run_block(struct imp *im, int v, struct block *out)
{
	char err[1024];
	const int n = B->launches;
	double ms[MAX_LAUNCHES];
	struct nv_acc a = {0};
	cu_res r;

	for (int i = 0; i < n; i++) {
		cu.EventRecord(im->ev[i], im->s);
		CHECK(launch(im, im->set[v][i % SETS], err, sizeof err) == FA_OK, "launch: %s", err);
	}
	cu.EventRecord(im->ev[n], im->s);
	/* the clock while the queue drains (the launches took a millisecond or two) */
	while ((r = cu.StreamQuery(im->s)) == 600 /* CUDA_ERROR_NOT_READY */) {
		nvml_sample(&a);
		usleep(3000);
	}
	CHECK(r == 0 && cu.EventSynchronize(im->ev[n]) == 0, "the block: CUDA error %d", r);
	for (int i = 0; i < n; i++) {
		float t = 0;
		CHECK(cu.EventElapsedTime(&t, im->ev[i], im->ev[i + 1]) == 0, "events");
		ms[i] = t;
	}
	float span = 0;
	CHECK(cu.EventElapsedTime(&span, im->ev[0], im->ev[n]) == 0, "events");
	out->med_ms = median(ms, n, NULL, NULL);
	out->tflops = fa_case_flops(&rot1) * n / (span / 1e3) / 1e12;
	out->mhz = a.n ? a.mhz / a.n : 0;
	out->watts = a.n ? a.mw / a.n / 1e3 : 0;
	out->reasons = a.reasons;
	if (nv.ok && nv.temp)
		nv.temp(nv.dev, 0 /* NVML_TEMPERATURE_GPU */, &out->temp_c);
	return 0;
}

/* Each phase's repeats, interleaved; the parent starts and ends the idle processes between
 * phases (phase_done, phase_go). */
static int run_phases(struct imp *im)
{
	for (int p = 0; p < PHASES; p++) {
		for (int i = 0; i < 60000 && B->phase_go < p; i++)
			usleep(1000);
		CHECK(B->phase_go >= p, "the parent never started phase %d", p);
		for (int r = 0; r < B->reps; r++)
			for (int j = 0; j < NVAR; j++) {
				int k = (r + j) % NVAR, v = r % 2 ? NVAR - 1 - k : k;
				CHECK(run_block(im, v, &B->v[v].b[p][r]) == 0, "variant %s",
				      var_name[v]);
			}
		__atomic_store_n(&B->phase_done, p + 1, __ATOMIC_SEQ_CST);
	}
	return 0;
}

/* Each variant's O of its first set against local's. */
static int compare_outputs(struct imp *im)
{
	size_t ob = (size_t)im->l.o_span * fa_dtype_size(rot1.dtype);
	char *ref = malloc(ob), *got = malloc(ob);
	CHECK(ref && got, "malloc");
	CHECK(cu.MemcpyDtoH(ref, im->set[V_LOCAL][0] + im->l.o_off, ob) == 0, "download");
	for (int v = 0; v < NVAR; v++) {
		CHECK(cu.MemcpyDtoH(got, im->set[v][0] + im->l.o_off, ob) == 0, "download");
		B->v[v].same_bits = memcmp(ref, got, ob) == 0;
	}
	free(ref);
	free(got);
	return 0;
}

static int importer(struct imp *im)
{
	char why[256], err[1024];
	struct fa_kernel_settings ks;
	cu_ptr own[SETS] = {0}, vmm_loc[SETS] = {0}, ipc[2][SETS] = {{0}}, one = 0;
	cu_ptr vmm_imp[SETS] = {0};
	fa_cu_mem_handle lvh[SETS] = {0}, ivh[SETS] = {0};
	int rc = 1;

	for (int i = 0; i < 120000 && B->exp_state == 0; i++)
		usleep(1000);
	CHECK(B->exp_state == 1, "the exporter failed");
	CHECK(fa_cu_start(0, why, sizeof why) == 0, "CUDA: %s", why);
	nvml_open();
	fa_test_kernel_settings(&ks);
	CHECK(fa_gpu_open(&im->g, 0, &ks, err, sizeof err) == FA_OK, "fa_gpu_open: %s", err);
	fa_gpu_set_cache_dir(im->g, g_cache, err, sizeof err);
	CHECK(cu.StreamCreate(&im->s, FA_CU_STREAM_NON_BLOCKING) == 0, "stream");
	for (int i = 0; i <= B->launches; i++)
		CHECK(cu.EventCreate(&im->ev[i], 0) == 0, "event");
	fa_case_layout(&rot1, &im->l);
	fa_case_desc(&rot1, &im->l, &im->d);
	if (open_sets(im, own, lvh, vmm_loc, ipc, &one, ivh, vmm_imp) != 0)
		goto out;
	/* warm: every set once (the first launch compiles), then ~2 s of local blocks so the
	 * clocks and the heat settle before the first timed block */
	for (int v = 0; v < NVAR; v++)
		for (int i = 0; i < SETS; i++)
			CHECK(launch(im, im->set[v][i], err, sizeof err) == FA_OK, "warm: %s", err);
	CHECK(cu.StreamSynchronize(im->s) == 0, "warm");
	{
		struct block w;
		uint64_t t0 = fa_test_now_us();
		while (fa_test_now_us() - t0 < 2000000)
			CHECK(run_block(im, V_LOCAL, &w) == 0, "warm");
	}
	if (run_phases(im) != 0 || compare_outputs(im) != 0)
		goto out;
	B->ok = 1;
	rc = 0;
out:
	for (int i = 0; i < SETS; i++) {
		if (own[i])
			cu.MemFree(own[i]);
		for (int k = 0; k < 2; k++)
			if (ipc[k][i])
				cu.IpcCloseMemHandle(ipc[k][i]);
		vmm_unmap(lvh[i], B->set_round, vmm_loc[i]);
		vmm_unmap(ivh[i], B->set_round, vmm_imp[i]);
	}
	if (one)
		cu.IpcCloseMemHandle(one);
	if (im->g)
		fa_gpu_close(im->g);
	return rc;
}

static int child_import(void)
{
	static struct imp im; /* the events: too big for the stack */
	int rc = importer(&im);
	__atomic_store_n(&B->phase_done, PHASES, __ATOMIC_SEQ_CST);
	__atomic_store_n(&B->exp_state, 2, __ATOMIC_SEQ_CST);
	return rc;
}

static int child_probe(void)
{
	return fa_cu_start(0, B->why, sizeof B->why) == 0 ? 0 : 3;
}

/* ---- the parent: processes, phases, the report ------------------------------------------------- */

static pid_t spawn(int (*fn)(void))
{
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p == 0)
		_exit(fn());
	return p;
}

/* Has pid not exited yet? (It stays unreaped for fa_test_waitpid.) */
static bool alive(pid_t pid)
{
	siginfo_t si = {0};
	return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0;
}

/* The phases' processes: phase 1's idle ones started (each holding its context) before the
 * importer may begin it, and ended before phase 2. Bounded by the importer's exit. */
static void drive_phases(pid_t imp, pid_t idle[IDLE_CTX])
{
	for (int p = 0; p < PHASES; p++) {
		uint64_t t0 = fa_test_now_us();
		while (B->phase_done < p && fa_test_now_us() - t0 < 300000000u && alive(imp))
			usleep(1000);
		if (B->phase_done != p)
			return; /* the importer finished early (failed) or is gone */
		if (p == 1) {
			__atomic_store_n(&B->idle_want, 1, __ATOMIC_SEQ_CST);
			for (int i = 0; i < IDLE_CTX; i++)
				idle[i] = spawn(child_idle);
			for (int i = 0; i < 30000 && B->idle_ready < IDLE_CTX; i++)
				usleep(1000);
		}
		if (p == 2) {
			__atomic_store_n(&B->idle_want, 0, __ATOMIC_SEQ_CST);
			for (int i = 0; i < IDLE_CTX; i++)
				if (idle[i] > 0) {
					fa_test_waitpid(idle[i], fa_test_ms(30000));
					idle[i] = -1;
				}
		}
		__atomic_store_n(&B->phase_go, p, __ATOMIC_SEQ_CST);
	}
}

static const char *kib(size_t off, char *buf, size_t cap)
{
	snprintf(buf, cap, "%zuK", off >> 10);
	return buf;
}

static void print_sets(int v)
{
	const struct var_res *r = &B->v[v];
	const struct set_info *s0 = &r->set[0];
	char a[16], b[16], c[16], d[16];
	printf("  %-9s set 0: exporter %#llx (%%2M %s, %%64K %s), importer %#llx (%%2M %s, %%64K "
	       "%s), in an allocation of %zu B; address range %+lld B, %zu B; mapping %+lld B, "
	       "%zu B; handle types %#llx; legacy IPC %d\n", var_name[v], s0->exp_ptr,
	       kib(s0->exp_ptr % MIB2, a, sizeof a), kib(s0->exp_ptr % KIB64, b, sizeof b),
	       s0->imp_ptr, kib(s0->imp_ptr % MIB2, c, sizeof c),
	       kib(s0->imp_ptr % KIB64, d, sizeof d),
	       s0->alloc, (long long)(s0->range_base - s0->imp_ptr), s0->range_size,
	       s0->map_base ? (long long)(s0->map_base - s0->imp_ptr) : 0LL, s0->map_size,
	       s0->handle_types, s0->legacy_ipc);
	printf("  %-9s all sets, importer %%2M:", "");
	for (int i = 0; i < SETS; i++)
		printf(" %s", kib(r->set[i].imp_ptr % MIB2, a, sizeof a));
	printf("; exporter %%2M:");
	for (int i = 0; i < SETS; i++)
		printf(" %s", kib(r->set[i].exp_ptr % MIB2, a, sizeof a));
	printf("; range sizes:");
	for (int i = 0; i < SETS; i++)
		printf(" %zu", r->set[i].range_size);
	printf("\n");
}

static void print_phase(int p)
{
	const int n = B->reps;
	static const char *const what[PHASES] = {
	    "importer and exporter alone", "with 8 more idle processes holding a CUDA context",
	    "alone again"};
	printf("phase %d (%s): median over %d repeats [min..max]\n", p, what[p], n);
	printf("  %-9s %22s %22s %24s %8s %7s %9s %5s %s\n", "variant", "kernel ms (events)",
	       "TFLOP/s (block span)", "/ local, same repeat", "SM MHz", "W", "kcycles", "degC",
	       "clock reasons");
	for (int v = 0; v < NVAR; v++) {
		double ms[MAX_REPS], tf[MAX_REPS], rt[MAX_REPS], mhz[MAX_REPS], w[MAX_REPS];
		double cyc[MAX_REPS], ms_lo, ms_hi, tf_lo, tf_hi, rt_lo, rt_hi;
		unsigned long long reasons = 0;
		unsigned temp = 0;
		for (int r = 0; r < n; r++) {
			const struct block *b = &B->v[v].b[p][r];
			ms[r] = b->med_ms;
			tf[r] = b->tflops;
			rt[r] = B->v[V_LOCAL].b[p][r].tflops > 0 ? b->tflops /
			                                               B->v[V_LOCAL].b[p][r].tflops : 0;
			mhz[r] = b->mhz;
			w[r] = b->watts;
			cyc[r] = b->med_ms * b->mhz; /* thousands of cycles */
			reasons |= b->reasons;
			temp = b->temp_c > temp ? b->temp_c : temp;
		}
		double mms = median(ms, n, &ms_lo, &ms_hi), mtf = median(tf, n, &tf_lo, &tf_hi);
		double mrt = median(rt, n, &rt_lo, &rt_hi);
		printf("  %-9s %6.4f [%6.4f..%6.4f] %6.1f [%6.1f..%6.1f] %6.3fx [%5.3f..%5.3f] %8.0f "
		       "%7.0f %9.1f %5u %#llx\n", var_name[v], mms, ms_lo, ms_hi, mtf, tf_lo, tf_hi,
		       mrt, rt_lo, rt_hi, median(mhz, n, NULL, NULL), median(w, n, NULL, NULL),
		       median(cyc, n, NULL, NULL), temp, reasons);
	}
}

int main(int argc, char **argv)
{
	int reps = 6, launches = 300;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-r") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-n") && i + 1 < argc)
			launches = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [-r REPS] [-n LAUNCHES]\n", argv[0]);
			return 2;
		}
	}
	reps = reps < 2 ? 2 : reps > MAX_REPS ? MAX_REPS : reps;
	launches = launches < SETS ? SETS : launches > MAX_LAUNCHES ? MAX_LAUNCHES : launches;
	B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (B == MAP_FAILED)
		return 1;
	memset(B, 0, sizeof *B);
	B->reps = reps;
	B->launches = launches;
	B->phase_go = -1;
	pid_t probe = spawn(child_probe);
	if (probe < 0 || fa_test_waitpid(probe, fa_test_ms(60000)) != 0) {
		printf("bench_ipcmem: skipped: no GPU (%s)\n", B->why);
		return 0;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, g_sock) != 0)
		return 1;
	snprintf(g_cache, sizeof g_cache, "/tmp/fa-bench-ipcmem.%d", (int)getpid());
	pid_t idle[IDLE_CTX];
	for (int i = 0; i < IDLE_CTX; i++)
		idle[i] = -1;
	pid_t exporter = spawn(child_export);
	pid_t imp = spawn(child_import);
	drive_phases(imp, idle);
	int rc = imp < 0 || fa_test_waitpid(imp, fa_test_ms(300000)) != 0;
	__atomic_store_n(&B->exp_state, 2, __ATOMIC_SEQ_CST);
	__atomic_store_n(&B->idle_want, 0, __ATOMIC_SEQ_CST);
	for (int i = 0; i < IDLE_CTX; i++)
		if (idle[i] > 0)
			fa_test_waitpid(idle[i], fa_test_ms(30000));
	if (exporter > 0 && fa_test_waitpid(exporter, fa_test_ms(60000)) != 0)
		rc = 1;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", g_cache);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_ipcmem: %s failed\n", cmd);
	if (!B->ok) {
		fprintf(stderr, "bench_ipcmem: the importer failed (its lines above say where)\n");
		return 1;
	}

	printf("\n== bench_ipcmem: bf16 B1 H16 S4096 D128 forward, %d launches a block over %d "
	       "tensor sets in turn, every variant once a repeat (order rotated, reversed every "
	       "other repeat); set %zu B (%zu rounded; VMM granularity %zu B); %s\n", launches,
	       SETS, B->set_bytes, B->set_round, B->granularity,
	       B->nvml[0] ? B->nvml : "SM clock and power: NVML, mean over the block");
	for (int v = 0; v < NVAR; v++)
		print_sets(v);
	for (int p = 0; p < PHASES; p++)
		print_phase(p);
	printf("outputs (O of set 0, against local's, bit for bit):");
	for (int v = 0; v < NVAR; v++)
		printf(" %s %s", var_name[v], B->v[v].same_bits ? "same" : "DIFFERENT");
	printf("\n");
	for (int v = 0; v < NVAR; v++)
		rc |= !B->v[v].same_bits;
	return rc;
}
