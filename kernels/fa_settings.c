/* fa_settings.c - the kernels' settings by name (fa_settings.h). */
#include "fa_settings.h"

#include "fa_err.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct fa_kernel_settings defaults = FA_KERNEL_SETTINGS_INIT;

static const char *const names[] = {
	"FA_WGMMA",   "FA_WGMMA16",          "FA_WG_BC",              "FA_WG_STAGES",
	"FA_WG_NWG",  "FA_NVRTC_EXTRA",      "FA_KERNEL_CACHE_MAX_MB", "CUDA_HOME",
	"FA_DECODE",  "FA_DECODE_SPLITS",    "FA_DECODE_STAGES",      "FA_BWD_DET_GROUP",
	"FA_WGMMA16_BWD", "FA_WGMMA32_BWD", "FA_BWD_DET_ROT",
	NULL,
};

void fa_kernel_settings_init(struct fa_kernel_settings *s)
{
	*s = defaults;
}

const struct fa_kernel_settings *fa_kernel_settings_default(void)
{
	return &defaults;
}

const char *const *fa_kernel_settings_names(void)
{
	return names;
}

/* A whole decimal number in [0, max]. */
static bool parse_count(const char *v, unsigned long long max, unsigned long long *out)
{
	char *end;
	if (*v < '0' || *v > '9')
		return false;
	unsigned long long x = strtoull(v, &end, 10);
	if (*end != '\0' || x > max)
		return false;
	*out = x;
	return true;
}

static fa_status bad(char *err, size_t errlen, const char *name, const char *value,
                     const char *want)
{
	return fa_err(err, errlen, FA_EINVAL, "%s: bad value \"%.64s\" (%s)", name, value, want);
}

static fa_status set_str(char *dst, size_t cap, const char *name, const char *value, char *err,
                         size_t errlen)
{
	if (strlen(value) >= cap) {
		return fa_err(err, errlen, FA_EINVAL, "%s: longer than %zu bytes", name, cap - 1);
	}
	memcpy(dst, value, strlen(value) + 1);
	return FA_OK;
}

fa_status fa_kernel_settings_set(struct fa_kernel_settings *s, const char *name,
                                 const char *value, char *err, size_t errlen)
{
	unsigned long long x;
	if (!name) {
		return fa_err(err, errlen, FA_EINVAL, "no setting name");
	}
	if (!value)
		return FA_OK;
	if (strcmp(name, "FA_WGMMA") == 0 || strcmp(name, "FA_BWD_DET_ROT") == 0) {
		if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)
			return bad(err, errlen, name, value, "0 or 1");
		*(name[3] == 'W' ? &s->wgmma : &s->bwd_det_rot) = value[0] == '1';
	} else if (strcmp(name, "FA_WGMMA16") == 0 || strcmp(name, "FA_WGMMA16_BWD") == 0 ||
	           strcmp(name, "FA_WGMMA32_BWD") == 0) {
		enum fa_wgmma16_mode *m = strcmp(name, "FA_WGMMA16_BWD") == 0   ? &s->wgmma16_bwd
		                          : strcmp(name, "FA_WGMMA32_BWD") == 0 ? &s->wgmma32_bwd
		                                                                : &s->wgmma16;
		if (strcmp(value, "auto") == 0)
			*m = FA_WGMMA16_MEASURED;
		else if (strcmp(value, "0") == 0)
			*m = FA_WGMMA16_OFF;
		else if (strcmp(value, "1") == 0)
			*m = FA_WGMMA16_ALL;
		else
			return bad(err, errlen, name, value, "auto, 0 or 1");
	} else if (strcmp(name, "FA_WG_BC") == 0 || strcmp(name, "FA_WG_STAGES") == 0 ||
	           strcmp(name, "FA_WG_NWG") == 0) {
		if (!parse_count(value, 1024, &x))
			return bad(err, errlen, name, value, "0 (all) or a count up to 1024");
		*(name[6] == 'B' ? &s->wg_bc : name[6] == 'S' ? &s->wg_stages : &s->wg_nwg) = (int)x;
	} else if (strcmp(name, "FA_NVRTC_EXTRA") == 0) {
		return set_str(s->nvrtc_extra, sizeof s->nvrtc_extra, name, value, err, errlen);
	} else if (strcmp(name, "FA_KERNEL_CACHE_MAX_MB") == 0) {
		if (!parse_count(value, (1ull << 40) - 1, &x))
			return bad(err, errlen, name, value, "MiB, 0 for the default 512");
		s->kernel_cache_max_mb = x;
	} else if (strcmp(name, "CUDA_HOME") == 0) {
		return set_str(s->cuda_home, sizeof s->cuda_home, name, value, err, errlen);
	} else if (strcmp(name, "FA_DECODE") == 0) {
		if (strcmp(value, "auto") == 0)
			s->decode = FA_DECODE_AUTO;
		else if (strcmp(value, "0") == 0)
			s->decode = FA_DECODE_OFF;
		else if (strcmp(value, "1") == 0)
			s->decode = FA_DECODE_ALL;
		else
			return bad(err, errlen, name, value, "auto, 0 or 1");
	} else if (strcmp(name, "FA_DECODE_SPLITS") == 0) {
		if (!parse_count(value, 1024, &x))
			return bad(err, errlen, name, value, "0 (the planner's) or a count up to 1024");
		s->decode_splits = (int)x;
	} else if (strcmp(name, "FA_DECODE_STAGES") == 0) {
		if (!parse_count(value, 8, &x) || x == 1)
			return bad(err, errlen, name, value, "0 (the planner's) or 2..8");
		s->decode_stages = (int)x;
	} else if (strcmp(name, "FA_BWD_DET_GROUP") == 0) {
		if (!parse_count(value, 8, &x) || (x & (x - 1)) != 0)
			return bad(err, errlen, name, value, "0 (groups of one), 1, 2, 4 or 8");
		s->bwd_det_group = (int)x;
	} else {
		return fa_err(err, errlen, FA_EINVAL, "unknown kernel setting %.64s", name);
	}
	return FA_OK;
}

bool fa_kernel_settings_get(const struct fa_kernel_settings *s, const char *name, char *buf,
                            size_t cap)
{
	if (!name)
		return false;
	if (strcmp(name, "FA_WGMMA") == 0)
		snprintf(buf, cap, "%d", s->wgmma ? 1 : 0);
	else if (strcmp(name, "FA_BWD_DET_ROT") == 0)
		snprintf(buf, cap, "%d", s->bwd_det_rot ? 1 : 0);
	else if (strcmp(name, "FA_WGMMA16") == 0 || strcmp(name, "FA_WGMMA16_BWD") == 0 ||
	         strcmp(name, "FA_WGMMA32_BWD") == 0) {
		const enum fa_wgmma16_mode m = strcmp(name, "FA_WGMMA16_BWD") == 0   ? s->wgmma16_bwd
		                               : strcmp(name, "FA_WGMMA32_BWD") == 0 ? s->wgmma32_bwd
		                                                                     : s->wgmma16;
		snprintf(buf, cap, "%s", m == FA_WGMMA16_OFF ? "0" : m == FA_WGMMA16_ALL ? "1" : "auto");
	}
	else if (strcmp(name, "FA_WG_BC") == 0)
		snprintf(buf, cap, "%d", s->wg_bc);
	else if (strcmp(name, "FA_WG_STAGES") == 0)
		snprintf(buf, cap, "%d", s->wg_stages);
	else if (strcmp(name, "FA_WG_NWG") == 0)
		snprintf(buf, cap, "%d", s->wg_nwg);
	else if (strcmp(name, "FA_NVRTC_EXTRA") == 0)
		snprintf(buf, cap, "%s", s->nvrtc_extra);
	else if (strcmp(name, "FA_KERNEL_CACHE_MAX_MB") == 0)
		snprintf(buf, cap, "%llu", s->kernel_cache_max_mb);
	else if (strcmp(name, "CUDA_HOME") == 0)
		snprintf(buf, cap, "%s", s->cuda_home);
	else if (strcmp(name, "FA_DECODE") == 0)
		snprintf(buf, cap, "%s", s->decode == FA_DECODE_OFF ? "0"
		                         : s->decode == FA_DECODE_ALL ? "1" : "auto");
	else if (strcmp(name, "FA_DECODE_SPLITS") == 0)
		snprintf(buf, cap, "%d", s->decode_splits);
	else if (strcmp(name, "FA_DECODE_STAGES") == 0)
		snprintf(buf, cap, "%d", s->decode_stages);
	else if (strcmp(name, "FA_BWD_DET_GROUP") == 0)
		snprintf(buf, cap, "%d", s->bwd_det_group);
	else
		return false;
	return true;
}
