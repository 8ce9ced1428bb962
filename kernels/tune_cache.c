/* tune_cache.c - the persistent tuning table: specialisation class -> winning tile.
 *
 * File: "<dir>/tuning/<32 hex of the GPU UUID>.tune", text, so it reads and diffs well:
 *
 *   # fa tuning table (fa_tune.h); one class a line; written by fa-daemon / fa-ctl tune
 *   fa-tune format=1 uuid=<32 hex> driver=13000 src=<64 hex>
 *   bf16 default d128 none sq12 sk12 gqa0 best=128x64:w4:r2:s2:p1 best_us=812.345 second=...
 *        second_us=... heur=... heur_us=... cands=16 runs=5 when=1712345678 crc=1a2b3c4d
 *
 * (an entry is one line). The header must match the table's identity exactly, else the whole
 * file is ignored: results from another GPU, driver or kernel source are never used. Each entry
 * line ends with a FNV-1a checksum of the text before " crc=", so a torn or edited line is
 * skipped (and counted) rather than misread. Writes go to a temporary file that is fsync'ed and
 * renamed over the old one, under an flock that also merges what other writers saved.
 */
#include "fa_tune.h"
#include "fa_err.h"
#include "fa_file.h"
#include "fa_diskcache.h" /* fa_sha256 */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fa_kernel_src.h"

#define WANTED_MAX 64
#define FILE_MAX (16u << 20) /* larger files are not read (4096 entries need ~1.5 MiB) */

struct fa_tune_table {
	pthread_mutex_t lock; /* guards everything below */
	struct fa_tune_ident id;
	struct fa_device_model model;
	char model_name[128];
	char dir[4096];  /* "<dir>/tuning", "" in memory */
	char path[4160]; /* "<dir>/tuning/<uuid>.tune", "" in memory */
	struct fa_tune_entry *e;
	int n, max;
	struct fa_tune_key wanted[WANTED_MAX];
	int nwanted;
	struct fa_tune_stats st;
	unsigned tmp_seq;
	/* bumped whenever an entry is added or replaced (put, open, the merge of a save): the
	 * launch memo's plans chosen under an older generation are stale (fa_launch_memo.h) */
	_Atomic uint64_t gen;
};

/* ---- identity and keys ------------------------------------------------------------------- */

void fa_tune_src_hash(const struct fa_kernel_settings *ks, uint8_t out[32])
{
	struct fa_sha256 c;
	const char *extra = (ks ? ks : fa_kernel_settings_default())->nvrtc_extra;
	fa_sha256_init(&c);
	fa_sha256_update(&c, fa_src_attn_fwd, fa_src_attn_fwd_len);
	fa_sha256_update(&c, fa_src_attn_fwd_sm90, fa_src_attn_fwd_sm90_len);
	/* the header both include: a change there changes both kernels */
	fa_sha256_update(&c, "\0hdr=", 5);
	fa_sha256_update(&c, fa_src_fa_device, fa_src_fa_device_len);
	/* experiments change the kernel without changing its text */
	fa_sha256_update(&c, "\0extra=", 7);
	fa_sha256_update(&c, extra, strlen(extra));
	fa_sha256_final(&c, out);
}

void fa_tune_ident_make(struct fa_tune_ident *id, const uint8_t uuid[16], int driver,
                        const struct fa_kernel_settings *ks)
{
	memset(id, 0, sizeof *id);
	memcpy(id->uuid, uuid, 16);
	id->driver = driver;
	id->ks = ks ? *ks : *fa_kernel_settings_default();
	fa_tune_src_hash(&id->ks, id->src_hash);
}

/* Bucket b holds (2^(b-1), 2^b]: ceil(log2(n)). */
static int log2_ceil(int64_t n)
{
	int b = 0;
	while (b < 62 && ((int64_t)1 << b) < n)
		b++;
	return b;
}

static int log2_floor(int64_t n)
{
	int b = 0;
	while (b < 62 && ((int64_t)1 << (b + 1)) <= n)
		b++;
	return b;
}

void fa_tune_key_make(const struct fa_attn_fwd_desc *d, struct fa_tune_key *k)
{
	memset(k, 0, sizeof *k);
	k->dtype = d->dtype;
	k->precision = fa_prec_resolve(d->dtype, d->precision);
	k->D = (int)d->D;
	k->mask = d->mask;
	k->sq_log2 = log2_ceil(d->Sq);
	k->sk_log2 = log2_ceil(d->Sk);
	k->gqa_log2 = log2_floor(d->Hkv > 0 ? d->Hq / d->Hkv : 1);
}

bool fa_tune_key_equal(const struct fa_tune_key *a, const struct fa_tune_key *b)
{
	return a->dtype == b->dtype && a->precision == b->precision && a->D == b->D &&
	       a->mask == b->mask && a->sq_log2 == b->sq_log2 && a->sk_log2 == b->sk_log2 &&
	       a->gqa_log2 == b->gqa_log2;
}

void fa_tune_key_format(const struct fa_tune_key *k, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s d%d %s sq2^%d sk2^%d gqa%d", fa_dtype_name(k->dtype),
	         k->dtype == FA_DTYPE_FP32 ? "/" : "",
	         k->dtype == FA_DTYPE_FP32 ? fa_prec_name(k->precision) : "", k->D,
	         fa_mask_name(k->mask), k->sq_log2, k->sk_log2, 1 << k->gqa_log2);
}

void fa_tune_key_desc(const struct fa_tune_key *k, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	d->dtype = k->dtype;
	d->precision = k->precision;
	d->mask = k->mask;
	d->D = k->D;
	d->Sq = (int64_t)1 << (k->sq_log2 > 24 ? 24 : k->sq_log2);
	d->Sk = (int64_t)1 << (k->sk_log2 > 24 ? 24 : k->sk_log2);
	int64_t ratio = (int64_t)1 << (k->gqa_log2 > 10 ? 10 : k->gqa_log2);
	d->Hkv = ratio >= 8 ? 1 : 8 / ratio;
	d->Hq = d->Hkv * ratio;
	int64_t b = 16384 / d->Sq;
	d->B = b < 1 ? 1 : b > 64 ? 64 : b;
	d->scale = 1.0 / sqrt((double)k->D);
	d->q_stride[2] = d->D;
	d->q_stride[1] = d->Hq * d->D;
	d->q_stride[0] = d->Sq * d->Hq * d->D;
	d->k_stride[2] = d->D;
	d->k_stride[1] = d->Hkv * d->D;
	d->k_stride[0] = d->Sk * d->Hkv * d->D;
	memcpy(d->v_stride, d->k_stride, sizeof d->v_stride);
	memcpy(d->o_stride, d->q_stride, sizeof d->o_stride);
	d->lse_stride[2] = 1;
	d->lse_stride[1] = d->Sq;
	d->lse_stride[0] = d->Hq * d->Sq;
}

/* ---- text lines ----------------------------------------------------------------------------- */

static uint32_t fnv1a(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 16777619u;
	}
	return h;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
	static const char x[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = x[b[i] >> 4];
		out[2 * i + 1] = x[b[i] & 15];
	}
	out[2 * n] = 0;
}

static void format_header(const struct fa_tune_ident *id, char *buf, size_t len)
{
	char u[33], s[65];
	hex(id->uuid, 16, u);
	hex(id->src_hash, 32, s);
	snprintf(buf, len, "fa-tune format=%d uuid=%s driver=%d src=%s", FA_TUNE_FORMAT, u,
	         id->driver, s);
}

static void tile_text(const struct fa_tile *t, char *buf, size_t len)
{
	snprintf(buf, len, "%dx%d:w%d:r%d:s%d:p%d", t->br, t->bc, t->nw, t->rt, t->stages, t->path);
}

/* One entry as a line (with its checksum and a newline). Returns its length. */
static int format_entry(const struct fa_tune_entry *e, char *buf, size_t len)
{
	char b[48], s[48], h[48];
	tile_text(&e->best, b, sizeof b);
	tile_text(&e->second, s, sizeof s);
	tile_text(&e->heur, h, sizeof h);
	int n = snprintf(buf, len,
	                 "%s %s d%d %s sq%d sk%d gqa%d best=%s best_us=%.3f second=%s second_us=%.3f "
	                 "heur=%s heur_us=%.3f cands=%d runs=%d when=%lld",
	                 fa_dtype_name(e->key.dtype), fa_prec_name(e->key.precision), e->key.D,
	                 fa_mask_name(e->key.mask), e->key.sq_log2, e->key.sk_log2, e->key.gqa_log2, b,
	                 e->best_us, s, e->second_us, h, e->heur_us, e->candidates, e->runs,
	                 (long long)e->when);
	if (n < 0 || (size_t)n >= len)
		return -1;
	int m = snprintf(buf + n, len - (size_t)n, " crc=%08x\n", fnv1a(buf, (size_t)n));
	if (m < 0 || (size_t)(n + m) >= len)
		return -1;
	return n + m;
}

static bool mask_parse(const char *s, fa_mask *m)
{
	static const fa_mask all[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
	                              FA_MASK_CAUSAL_TOP_LEFT};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (strcmp(s, fa_mask_name(all[i])) == 0) {
			*m = all[i];
			return true;
		}
	return false;
}

/* A tile as the planner could have made it (whether it fits a device is fa_tune_pick's
 * business); path 0 is the "none" of a missing runner-up. */
static bool tile_sane(const struct fa_tile *t, bool may_be_none)
{
	if (may_be_none && t->path == 0 && t->nw == 0 && t->br == 0)
		return true;
	if (fa_kpath_is_wg(t->path))
		return (t->nw == 4 || t->nw == 8) && t->rt == 1 && t->br == 16 * t->nw &&
		       (t->bc == 16 || t->bc == 32 || t->bc == 64 || t->bc == 128) &&
		       (t->stages == 2 || t->stages == 3);
	return (t->path == FA_KPATH_16 || t->path == FA_KPATH_32) &&
	       (t->nw == 2 || t->nw == 4 || t->nw == 8) && (t->rt == 1 || t->rt == 2) &&
	       t->br == 16 * t->nw * t->rt && (t->bc == 16 || t->bc == 32 || t->bc == 64 ||
	       t->bc == 128) && (t->stages == 2 || t->stages == 3);
}

static bool time_sane(double us, bool may_be_zero)
{
	return isfinite(us) && (us > 0 || (may_be_zero && us == 0)) && us < 1e12;
}

/* Parse one entry line (without its newline). */
static bool parse_entry(const char *line, struct fa_tune_entry *e)
{
	const char *c = strstr(line, " crc=");
	if (!c)
		return false;
	unsigned crc = 0;
	int end = 0;
	if (sscanf(c, " crc=%8x%n", &crc, &end) != 1 || c[end] != 0 ||
	    crc != fnv1a(line, (size_t)(c - line)))
		return false;
	char dt[16], pr[16], mk[32];
	long long when = 0;
	struct fa_tile *b = &e->best, *s = &e->second, *h = &e->heur;
	memset(e, 0, sizeof *e);
	int n = 0;
	int got = sscanf(line,
	                 "%15s %15s d%d %31s sq%d sk%d gqa%d "
	                 "best=%dx%d:w%d:r%d:s%d:p%d best_us=%lf "
	                 "second=%dx%d:w%d:r%d:s%d:p%d second_us=%lf "
	                 "heur=%dx%d:w%d:r%d:s%d:p%d heur_us=%lf cands=%d runs=%d when=%lld%n",
	                 dt, pr, &e->key.D, mk, &e->key.sq_log2, &e->key.sk_log2, &e->key.gqa_log2,
	                 &b->br, &b->bc, &b->nw, &b->rt, &b->stages, &b->path, &e->best_us,
	                 &s->br, &s->bc, &s->nw, &s->rt, &s->stages, &s->path, &e->second_us,
	                 &h->br, &h->bc, &h->nw, &h->rt, &h->stages, &h->path, &e->heur_us,
	                 &e->candidates, &e->runs, &when, &n);
	if (got != 31 || line + n != c)
		return false;
	e->when = when;
	if (!fa_dtype_parse(dt, &e->key.dtype) || !fa_prec_parse(pr, &e->key.precision) ||
	    !mask_parse(mk, &e->key.mask))
		return false;
	if (e->key.precision != fa_prec_resolve(e->key.dtype, e->key.precision))
		return false;
	if (e->key.D < 8 || e->key.D > FA_ATTN_MAX_HEAD_DIM || e->key.D % 8 != 0 ||
	    e->key.sq_log2 < 0 || e->key.sq_log2 > 40 || e->key.sk_log2 < 0 || e->key.sk_log2 > 40 ||
	    e->key.gqa_log2 < 0 || e->key.gqa_log2 > 20)
		return false;
	return tile_sane(b, false) && tile_sane(s, true) && tile_sane(h, false) &&
	       time_sane(e->best_us, false) && time_sane(e->second_us, true) &&
	       time_sane(e->heur_us, true) && e->candidates >= 1 && e->runs >= 1;
}

/* ---- the table in memory ---------------------------------------------------------------- */

static int find(const struct fa_tune_table *t, const struct fa_tune_key *k)
{
	for (int i = 0; i < t->n; i++)
		if (fa_tune_key_equal(&t->e[i].key, k))
			return i;
	return -1;
}

/* Insert or replace (newer_only: keep an existing entry tuned later). Evicts the oldest entry
 * when full. Lock held. */
static void put_locked(struct fa_tune_table *t, const struct fa_tune_entry *e, bool newer_only)
{
	int i = find(t, &e->key);
	if (i >= 0) {
		if (!newer_only || e->when > t->e[i].when) {
			t->e[i] = *e;
			atomic_fetch_add(&t->gen, 1);
		}
		return;
	}
	if (t->n >= t->max) {
		int old = 0;
		for (int j = 1; j < t->n; j++)
			if (t->e[j].when < t->e[old].when)
				old = j;
		if (newer_only && t->e[old].when >= e->when)
			return;
		t->e[old] = t->e[--t->n];
		t->st.evicted++;
	}
	t->e[t->n++] = *e;
	atomic_fetch_add(&t->gen, 1);
}

/* Read the file of t's identity: entries into the table through put_locked (newer wins).
 * *loaded / *corrupt count lines; *stale set (with why) when the header is another identity's.
 * A missing file is fine. Lock held. */
static void read_file(struct fa_tune_table *t, int *loaded, int *corrupt, bool *stale, char *why,
                      size_t whylen)
{
	*loaded = *corrupt = 0;
	*stale = false;
	int fd = open(t->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		if (errno != ENOENT)
			snprintf(why, whylen, "cannot read the file: %s", strerror(errno));
		return;
	}
	struct stat sb;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > FILE_MAX) {
		snprintf(why, whylen, "not a regular file of at most %u bytes: ignored", FILE_MAX);
		close(fd);
		return;
	}
	char *buf = malloc((size_t)sb.st_size + 1);
	size_t have = 0;
	if (!buf) {
		close(fd);
		snprintf(why, whylen, "out of memory reading the file");
		return;
	}
	while (have < (size_t)sb.st_size) {
		ssize_t r = read(fd, buf + have, (size_t)sb.st_size - have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		have += (size_t)r;
	}
	close(fd);
	buf[have] = 0;
	char header[256];
	format_header(&t->id, header, sizeof header);
	bool seen_header = false;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		size_t len = strlen(line);
		if (len > 0 && line[len - 1] == '\r')
			line[--len] = 0;
		if (len == 0 || line[0] == '#')
			continue;
		if (!seen_header) {
			if (strncmp(line, "fa-tune ", 8) != 0) {
				snprintf(why, whylen, "no \"fa-tune\" header line: ignored");
				*stale = true;
				break;
			}
			if (strcmp(line, header) != 0) {
				snprintf(why, whylen, "tuned for another GPU, driver, kernel source or format: "
				         "ignored (it will be rewritten)");
				*stale = true;
				break;
			}
			seen_header = true;
			continue;
		}
		struct fa_tune_entry e;
		if (!parse_entry(line, &e)) {
			(*corrupt)++;
			continue;
		}
		put_locked(t, &e, true);
		(*loaded)++;
	}
	free(buf);
}

static fa_status mkdir_p(const char *path, char *err, size_t errlen)
{
	char tmp[4096];
	if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) {
		return fa_err(err, errlen, FA_EINVAL, "tuning table: path too long");
	}
	for (char *p = tmp + 1;; p++) {
		if (*p == '/' || *p == 0) {
			char c = *p;
			*p = 0;
			if (mkdir(tmp, 0750) != 0 && errno != EEXIST) {
				return fa_err(err, errlen, FA_ESYS,
				              "tuning table: cannot create %s: %s", tmp,
				              strerror(errno));
			}
			*p = c;
			if (c == 0)
				break;
		}
	}
	struct stat sb;
	if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
		return fa_err(err, errlen, FA_ESYS, "tuning table: %s is not a directory", path);
	}
	return FA_OK;
}

fa_status fa_tune_table_open(struct fa_tune_table **out, const char *dir,
                             const struct fa_tune_ident *id, const struct fa_device_model *model,
                             int max_entries, char *err, size_t errlen)
{
	*out = NULL;
	if (!id || !model) {
		return fa_err(err, errlen, FA_EINVAL,
		              "tuning table: NULL identity or device model");
	}
	struct fa_tune_table *t = calloc(1, sizeof *t);
	if (!t)
		return FA_ENOMEM;
	t->max = max_entries > 0 ? max_entries : FA_TUNE_DEFAULT_MAX_ENTRIES;
	t->e = calloc((size_t)t->max, sizeof *t->e);
	if (!t->e) {
		free(t);
		return FA_ENOMEM;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->id = *id;
	t->model = *model;
	snprintf(t->model_name, sizeof t->model_name, "%s", model->name ? model->name : "?");
	t->model.name = t->model_name;
	if (dir && *dir) {
		if (strlen(dir) > 4000) {
			snprintf(err, errlen, "tuning table: directory name too long");
			fa_tune_table_close(t);
			return FA_EINVAL;
		}
		snprintf(t->dir, sizeof t->dir, "%s/tuning", dir);
		fa_status st = mkdir_p(t->dir, err, errlen);
		struct stat sb;
		if (st == FA_OK && stat(t->dir, &sb) == 0 && (sb.st_mode & S_IWOTH)) {
			snprintf(err, errlen, "tuning table: %s is writable by others: refused", t->dir);
			st = FA_EPERM;
		}
		if (st != FA_OK) {
			fa_tune_table_close(t);
			return st;
		}
		char u[33];
		hex(id->uuid, 16, u);
		snprintf(t->path, sizeof t->path, "%s/%s.tune", t->dir, u);
		read_file(t, &t->st.loaded, &t->st.corrupt, &t->st.stale, t->st.why,
		          sizeof t->st.why);
	}
	*out = t;
	return FA_OK;
}

void fa_tune_table_close(struct fa_tune_table *t)
{
	if (!t)
		return;
	pthread_mutex_destroy(&t->lock);
	free(t->e);
	free(t);
}

const char *fa_tune_table_path(const struct fa_tune_table *t) { return t->path; }
const struct fa_device_model *fa_tune_table_model(const struct fa_tune_table *t)
{
	return &t->model;
}

const struct fa_kernel_settings *fa_tune_table_settings(const struct fa_tune_table *t)
{
	return &t->id.ks;
}

bool fa_tune_table_get(struct fa_tune_table *t, const struct fa_tune_key *k,
                       struct fa_tune_entry *e)
{
	pthread_mutex_lock(&t->lock);
	int i = find(t, k);
	if (i >= 0 && e)
		*e = t->e[i];
	pthread_mutex_unlock(&t->lock);
	return i >= 0;
}

fa_status fa_tune_table_put(struct fa_tune_table *t, const struct fa_tune_entry *e)
{
	if (!t || !e || !tile_sane(&e->best, false))
		return FA_EINVAL;
	pthread_mutex_lock(&t->lock);
	put_locked(t, e, false);
	pthread_mutex_unlock(&t->lock);
	return FA_OK;
}

fa_status fa_tune_table_save(struct fa_tune_table *t, char *err, size_t errlen)
{
	if (!t->path[0])
		return FA_OK;
	char lockp[4200], tmp[4300];
	snprintf(lockp, sizeof lockp, "%s/.lock", t->dir);
	/* one open file description per call: flock then serialises threads as well as processes */
	int lfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
	if (lfd < 0) {
		return fa_err(err, errlen, FA_ESYS, "tuning table: %s: %s", lockp, strerror(errno));
	}
	while (flock(lfd, LOCK_EX) != 0 && errno == EINTR)
		;
	fa_status st = FA_OK;
	pthread_mutex_lock(&t->lock);
	/* merge what others saved since we read (same identity only; newer entries win) */
	int loaded, corrupt;
	bool stale;
	char why[160] = "";
	read_file(t, &loaded, &corrupt, &stale, why, sizeof why);
	size_t cap = (size_t)t->n * 512 + 512, len = 0;
	char *buf = malloc(cap);
	if (!buf) {
		st = FA_ENOMEM;
		goto out;
	}
	len += (size_t)snprintf(buf, cap, "# fa tuning table (kernels/fa_tune.h): one class a line; "
	                        "device %s; written by fa-daemon or fa-ctl tune\n", t->model_name);
	format_header(&t->id, buf + len, cap - len);
	len += strlen(buf + len);
	buf[len++] = '\n';
	for (int i = 0; i < t->n; i++) {
		int m = format_entry(&t->e[i], buf + len, cap - len);
		if (m > 0)
			len += (size_t)m;
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(tmp, sizeof tmp, "%s/.tmp.%d.%u.%ld", t->dir, (int)getpid(), t->tmp_seq++,
	         (long)ts.tv_nsec);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0640);
	if (fd < 0) {
		snprintf(err, errlen, "tuning table: %s: %s", tmp, strerror(errno));
		st = FA_ESYS;
		goto out;
	}
	struct iovec part = {buf, len};
	st = fa_file_publish(fd, tmp, t->path, t->dir, &part, 1, "tuning table", err, errlen);
out:
	pthread_mutex_unlock(&t->lock);
	free(buf);
	flock(lfd, LOCK_UN);
	close(lfd);
	return st;
}

void fa_tune_table_stats(struct fa_tune_table *t, struct fa_tune_stats *out)
{
	pthread_mutex_lock(&t->lock);
	*out = t->st;
	out->entries = t->n;
	pthread_mutex_unlock(&t->lock);
}

bool fa_tune_table_next_wanted(struct fa_tune_table *t, struct fa_tune_key *k)
{
	bool got = false;
	pthread_mutex_lock(&t->lock);
	while (t->nwanted > 0 && !got) {
		*k = t->wanted[0];
		memmove(&t->wanted[0], &t->wanted[1], (size_t)(t->nwanted - 1) * sizeof t->wanted[0]);
		t->nwanted--;
		got = find(t, k) < 0; /* tuned meanwhile (fa-ctl tune, another path): skip */
	}
	pthread_mutex_unlock(&t->lock);
	return got;
}

uint64_t fa_tune_table_generation(const struct fa_tune_table *t)
{
	return atomic_load(&((struct fa_tune_table *)t)->gen);
}

/* fa_tune.h: count and remember a pick. */
void fa_tune_table_note(struct fa_tune_table *t, const struct fa_tune_key *k, int src)
{
	pthread_mutex_lock(&t->lock);
	if (src == FA_TUNE_SRC_TUNED) {
		t->st.hits++;
	} else if (src == FA_TUNE_SRC_UNFIT) {
		/* not queued again: the class is in the table, next_wanted would skip it anyway */
		t->st.unfit++;
	} else {
		t->st.misses++;
		bool known = false;
		for (int i = 0; i < t->nwanted && !known; i++)
			known = fa_tune_key_equal(&t->wanted[i], k);
		if (!known && t->nwanted < WANTED_MAX)
			t->wanted[t->nwanted++] = *k;
	}
	pthread_mutex_unlock(&t->lock);
}
