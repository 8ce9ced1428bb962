/* fa_ctl.h - subcommands of fa-ctl, one file each (fa_ctl.c has main() and the dispatch table). */
#ifndef FA_CTL_H
#define FA_CTL_H

/* `fa-ctl plan ...`: the tile planner's choice for a shape, offline (--arch) or for the real
 * device. argv[0] is "plan". Returns the process exit status. */
int fa_ctl_plan_main(int argc, char **argv);

/* `fa-ctl tune ...`: tune shapes on the local GPU into the daemon's tuning table (fa_ctl_tune.c).
 * argv[0] is "tune". Returns the process exit status. */
int fa_ctl_tune_main(int argc, char **argv);

struct fa_kernel_settings;

/* The kernel settings of the GPU subcommands (plan, tune): the defaults, then the environment
 * variables the daemon reads for the same settings (FA_WGMMA, FA_WGMMA16, FA_NVRTC_EXTRA, ...,
 * kernels/fa_settings.h), so fa-ctl plans and tunes what the daemon would run. A bad value is
 * printed as "<cmd>: ..." on stderr and 2 returned (the exit status); 0 otherwise. */
int fa_ctl_kernel_settings(struct fa_kernel_settings *ks, const char *cmd);

#endif /* FA_CTL_H */
