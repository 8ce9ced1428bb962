/* fa_ksettings.c - the kernel settings from the environment (fa_ksettings.h). */
#include "fa_ksettings.h"

#include <stdio.h>
#include <stdlib.h>

void fa_test_kernel_settings(struct fa_kernel_settings *ks)
{
	char err[256];
	fa_kernel_settings_init(ks);
	for (const char *const *n = fa_kernel_settings_names(); *n; n++)
		if (fa_kernel_settings_set(ks, *n, getenv(*n), err, sizeof err) != FA_OK)
			fprintf(stderr, "kernel settings: %s (default kept)\n", err);
}
