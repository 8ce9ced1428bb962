/* fa_ksettings.h - the kernel settings of a test or benchmark, from the environment.
 *
 * Kernels never read the environment (kernels/fa_settings.h); the test programs that open NVRTC
 * or a GPU take their settings from it through this one helper, so FA_WGMMA=0, FA_WGMMA16=1,
 * FA_NVRTC_EXTRA="-D..." and the others keep working as before (tests/README.md). */
#ifndef FA_KSETTINGS_H
#define FA_KSETTINGS_H

#include "fa_settings.h"

/* The defaults, then every setting whose environment variable is set (fa_kernel_settings_names).
 * A bad value is reported on stderr and left at its default. Not thread-safe (getenv). */
void fa_test_kernel_settings(struct fa_kernel_settings *ks);

#endif /* FA_KSETTINGS_H */
