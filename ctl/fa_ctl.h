/* fa_ctl.h - subcommands of fa-ctl, one file each (fa_ctl.c has main() and the dispatch table). */
#ifndef FA_CTL_H
#define FA_CTL_H

/* `fa-ctl plan ...`: the tile planner's choice for a shape, offline (--arch) or for the real
 * device. argv[0] is "plan". Returns the process exit status. */
int fa_ctl_plan_main(int argc, char **argv);

/* `fa-ctl tune ...`: tune shapes on the local GPU into the daemon's tuning table (fa_ctl_tune.c).
 * argv[0] is "tune". Returns the process exit status. */
int fa_ctl_tune_main(int argc, char **argv);

#endif /* FA_CTL_H */
