/* fa_diskcache.h - compiled kernels (cubins) on disk, so a restarted daemon compiles nothing.
 *
 * Layout: "<dir>/kernels/<32 hex digits>.cubin", one file per specialisation. The name is the
 * first 128 bits of the key, a SHA-256 of (format version, kernel source text and the header it
 * includes, NVRTC version,
 * the full NVRTC option list incl. -arch, the -D specialisation macros and FA_NVRTC_EXTRA).
 * Each file is a 192-byte header (magic, format version, the full 256-bit key, payload length,
 * payload SHA-256, the specialisation's name for people) followed by the cubin, so a truncated,
 * corrupt, foreign or misnamed file is detected; it is then removed and the kernel recompiled.
 * Files are written to a temporary name in the same directory (O_EXCL, fsync) and renamed into
 * place: readers and concurrent daemons only ever see whole files. The size is bounded: after
 * each store the least recently used entries (by mtime; a load touches it) beyond the bound
 * are removed. kernels/README.md ("Kernel cache") has the rest.
 *
 * Needs no GPU: NVRTC alone fills it (fa_diskcache_precompile). Every function is thread-safe
 * and safe between processes sharing the directory. Nothing here logs: problems come back as a
 * status plus text in err (or in struct fa_cubin_info) for the caller to log.
 */
#ifndef FA_DISKCACHE_H
#define FA_DISKCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_gpu.h"

#define FA_DISKCACHE_FORMAT 1                          /* bump when the file layout changes */
#define FA_DISKCACHE_HEADER_BYTES 192
#define FA_DISKCACHE_DEFAULT_MAX_BYTES (512ull << 20)   /* 512 MiB */
#define FA_DISKCACHE_MAX_PAYLOAD (64u << 20)           /* larger files are rejected as corrupt */

/* A cache key: SHA-256 of everything a cubin depends on. */
struct fa_diskcache_key {
	uint8_t b[32];
};

/* SHA-256 (FIPS 180-4), also for other caches that key on the kernel source. */
struct fa_sha256 {
	uint32_t h[8];
	uint64_t len;  /* bytes hashed so far */
	uint8_t buf[64];
	size_t nbuf;
};
void fa_sha256_init(struct fa_sha256 *c);
void fa_sha256_update(struct fa_sha256 *c, const void *data, size_t n);
void fa_sha256_final(struct fa_sha256 *c, uint8_t out[32]);
void fa_sha256(const void *data, size_t n, uint8_t out[32]);

struct fa_diskcache;

/* Use "<dir>/kernels" as the cache (dir and kernels/ are created with mode 0750 when missing,
 * parents too). max_bytes bounds the total size of entries (0: FA_DISKCACHE_DEFAULT_MAX_BYTES).
 * A trial file is created and removed to prove the directory writable; stale temporary files
 * of crashed writers are removed. Returns FA_OK; FA_EINVAL (dir NULL, empty or too long),
 * FA_ESYS (cannot create, not a directory, not writable: err names the path and errno's text),
 * FA_EPERM (kernels/ is writable by others: cubins from there would run in the daemon),
 * FA_ENOMEM. On failure *out is NULL and the caller runs without a disk cache. */
fa_status fa_diskcache_open(struct fa_diskcache **out, const char *dir, uint64_t max_bytes,
                            char *err, size_t errlen);
/* Free the handle (the files stay). Safe on NULL. */
void fa_diskcache_close(struct fa_diskcache *dc);
/* "<dir>/kernels", owned by dc. */
const char *fa_diskcache_path(const struct fa_diskcache *dc);

/* The key of a compile: source text, the option list as fa_nvrtc_compile_opts is given it, and
 * NVRTC's version. Options are hashed with their lengths, so {"-DA", "B"} != {"-DAB"}. */
void fa_diskcache_key_make(struct fa_diskcache_key *k, const char *src, size_t srclen,
                           const struct fa_nvrtc_opts *o, int nvrtc_major, int nvrtc_minor);
/* The key of spec compiled by n now: its source (fa_kernel_source) and the header it includes
 * (fa_device.cuh), fa_nvrtc_options(n, spec) (so n's FA_NVRTC_EXTRA), NVRTC's version. Fills *o (may be NULL) with the options that were hashed. */
void fa_diskcache_key_for_spec(struct fa_diskcache_key *k, const struct fa_nvrtc *n,
                               const struct fa_kernel_spec *spec, struct fa_nvrtc_opts *o);
/* The file name's 32 hex digits (the key's first 16 bytes) and a NUL. */
void fa_diskcache_key_hex(const struct fa_diskcache_key *k, char out[33]);
/* The entry's full path into buf (caller's, cap >= strlen(path(dc)) + 40). */
void fa_diskcache_entry_path(const struct fa_diskcache *dc, const struct fa_diskcache_key *k,
                             char *buf, size_t cap);

/* Read the entry of key k. FA_OK with *hit true: *data (malloc'd, caller frees) and *size hold
 * the cubin, and the entry's mtime is refreshed (LRU). FA_OK with *hit false: no entry.
 * FA_EPROTO: the file was bad (truncated, wrong magic/format/key, checksum mismatch; err says
 * which) and has been removed; FA_ESYS: it could not be read (err). FA_ENOMEM. In every case
 * other than a hit *data is NULL and the caller compiles. */
fa_status fa_diskcache_load(struct fa_diskcache *dc, const struct fa_diskcache_key *k, void **data,
                            size_t *size, bool *hit, char *err, size_t errlen);

/* Store a cubin under key k, atomically (temporary file, fsync, rename), with `name` (the
 * specialisation's name, may be NULL) in the header, then prune the cache to its bound (never
 * removing this entry). Another process storing the same key at the same time is fine: one
 * whole file wins. Returns FA_OK; FA_EINVAL (size 0 or above FA_DISKCACHE_MAX_PAYLOAD),
 * FA_ESYS (err: the path and errno's text; nothing is left behind), FA_ENOMEM. */
fa_status fa_diskcache_store(struct fa_diskcache *dc, const struct fa_diskcache_key *k,
                             const char *name, const void *data, size_t size, char *err,
                             size_t errlen);

/* Remove the entry of key k if there is one (a cubin the driver refused to load). FA_OK, or
 * FA_ESYS with err. */
fa_status fa_diskcache_remove(struct fa_diskcache *dc, const struct fa_diskcache_key *k, char *err,
                              size_t errlen);

/* Remove least recently used entries until the total is at most max_bytes (0: the handle's
 * bound), temporary files older than 10 minutes, and nothing else (other files are left
 * alone). *files / *bytes (may be NULL): what remains. FA_OK or FA_ESYS. */
fa_status fa_diskcache_prune(struct fa_diskcache *dc, uint64_t max_bytes, uint64_t *files,
                             uint64_t *bytes, char *err, size_t errlen);

/* ---- the compile path, shared by the GPU (gpu_cuda.c) and precompilation ----------------- */

/* How fa_kernel_cubin got its cubin, for counters and logs. */
struct fa_cubin_info {
	bool from_disk;              /* loaded from the disk cache */
	bool compiled;               /* compiled by NVRTC (usage and compile_ms valid) */
	bool stored;                 /* written to the disk cache */
	struct fa_diskcache_key key; /* the key looked up (for fa_diskcache_remove) */
	struct fa_kernel_usage usage;
	double compile_ms;
	int disk_errors;             /* 0, 1 or 2 (a bad entry, a failed store) */
	char disk_msg[768];          /* what went wrong on disk, "" if nothing: log it */
};

/* The cubin of spec: from dc when it has a valid entry, else compiled by NVRTC and stored in dc
 * (dc NULL: compile only). Disk problems never fail the call: they are counted and described
 * in info. Returns FA_OK with *cubin (malloc'd, caller frees) and *size; or the compile's
 * status (FA_EINTERNAL with NVRTC's log, FA_ENOMEM) with err. Thread-safe. */
fa_status fa_kernel_cubin(struct fa_nvrtc *n, struct fa_diskcache *dc,
                          const struct fa_kernel_spec *spec, void **cubin, size_t *size,
                          struct fa_cubin_info *info, char *err, size_t errlen);

/* Fill the disk cache for count specialisations with NVRTC only (no driver, no GPU): each one
 * that has no valid entry is compiled and stored. *compiled / *cached (may be NULL): how many
 * were compiled, how many were already there. Stops at the first failure: a compile error
 * (FA_EINTERNAL, NVRTC's log in err) or a store that failed (FA_ESYS, err). */
fa_status fa_diskcache_precompile(struct fa_diskcache *dc, struct fa_nvrtc *n,
                                  const struct fa_kernel_spec *specs, int count, int *compiled,
                                  int *cached, char *err, size_t errlen);

#endif /* FA_DISKCACHE_H */
