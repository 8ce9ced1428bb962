/* backend.c - the table of backends and picking one (what every backend shares is in backend.h). */
#include "backend.h"

#include <string.h>

#include "log.h"
#include "util.h"

/* In order of preference for --backend auto: the GPU when one opens, else the CPU. */
static const struct backend_ops *const backend_table[] = {
	&backend_gpu_ops,
	&backend_cpu_ops,
	NULL,
};

/* Try the named backend, or each in table order for "auto". */
fa_status backend_open(const char *which, struct backend **out, uv_loop_t *loop,
                       const struct config *cfg, backend_done_fn done, void *arg, char *err,
                       size_t errlen)
{
	bool any = strcmp(which, "auto") == 0;
	fa_status st = FA_EINVAL;

	*out = NULL;
	for (const struct backend_ops *const *o = backend_table; *o != NULL; o++) {
		if (!any && strcmp((*o)->name, which) != 0)
			continue;
		st = (*o)->open(out, loop, cfg, done, arg, err, errlen);
		if (st == FA_OK || !any)
			return st;
		log_notice("backend: %s unavailable (%s), trying the next", (*o)->name, err);
	}
	if (st == FA_EINVAL && !any)
		return fa_err(err, errlen, FA_EINVAL, "unknown backend '%s'", which);
	return st;
}
