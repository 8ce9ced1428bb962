/* fa_ctl.h - subcommands of fa-ctl, one file each (fa_ctl.c has main() and the dispatch table). */
#ifndef FA_CTL_H
#define FA_CTL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* fa-ctl's exit statuses, the same in every subcommand (`fa-ctl --help`, ctl/README.md). */
enum {
	FA_CTL_EXIT_OK = 0,      /* success */
	FA_CTL_EXIT_FAILURE = 1, /* a failure at run time: no daemon, a status from it, no GPU, ... */
	FA_CTL_EXIT_USAGE = 2,   /* a usage error: unknown command or option, a missing or bad value */
};

/* Print "fa-ctl: <cmd>: <message>\n" on stderr (cmd NULL: "fa-ctl: <message>"), the one prefix
 * of every fa-ctl error. Returns FA_CTL_EXIT_USAGE, for `return fa_ctl_usage_error(...)`. */
__attribute__((format(printf, 2, 3))) int fa_ctl_usage_error(const char *cmd, const char *fmt,
                                                             ...);

/* The same prefix and text for a failure at run time. Returns FA_CTL_EXIT_FAILURE. */
__attribute__((format(printf, 2, 3))) int fa_ctl_failure(const char *cmd, const char *fmt, ...);

/* Write s to f as a JSON string: quoted, with '"', '\\' and control characters escaped (other
 * bytes as they are: the texts are UTF-8 or ASCII). */
void fa_ctl_json_string(FILE *f, const char *s);

/* `fa-ctl plan ...`: the tile planner's choice for a shape, offline (--arch) or for the real
 * device. argv[0] is "plan". --json prints the plan (or the status when nothing fits) as one JSON object.
 * Returns the process exit status (FA_CTL_EXIT_*). */
int fa_ctl_plan_main(int argc, char **argv);

/* `fa-ctl tune ...`: tune shapes on the local GPU into the daemon's tuning table (fa_ctl_tune.c).
 * argv[0] is "tune". Returns the process exit status (FA_CTL_EXIT_*). */
int fa_ctl_tune_main(int argc, char **argv);

/* `fa-ctl clients [--json]`: the daemon's sessions through fa_clients() (fa_ctl_clients.c), on
 * a client of its own opened at socket (NULL: the default) with timeout_ms (-1: the default).
 * argv[0] is "clients". Returns the process exit status (FA_CTL_EXIT_*). */
int fa_ctl_clients_main(const char *socket, int timeout_ms, int argc, char **argv);

struct fa_kernel_settings;
struct fa_device_model;
struct fa_plan_req;

/* `fa-ctl plan --decode` (fa_ctl_plan_infer.c): the decode kernel's plan on model for r's dtype,
 * head dim, mask, B, H (query heads), Sq, Sk, with hkv kv heads (0: H) and, when cache_lens is
 * given ("a,b,c": one length per sequence), over a KV cache of those lengths (paged when
 * page_size > 0). Text or one JSON object on stdout; the status on stderr when it fails.
 * Returns the process exit status (FA_CTL_EXIT_*). */
int fa_ctl_plan_decode(const struct fa_device_model *model, bool real,
                       const struct fa_plan_req *r, int64_t hkv, const char *cache_lens,
                       int64_t page_size, bool json);

/* `fa-ctl plan --prefill` (fa_ctl_plan_infer.c): the prefill kernel's tile over an inference
 * layout (a paged cache when page_size > 0, else sequences of their own lengths) for r's dtype,
 * head dim, mask, B, H and the longest sequence's Sq and Sk, with hkv kv heads (0: H), and the
 * dense tile of the same shape beside it. Text or one JSON object on stdout; the status on
 * stderr when it fails. Returns the process exit status (FA_CTL_EXIT_*). */
int fa_ctl_plan_prefill(const struct fa_device_model *model, bool real,
                        const struct fa_plan_req *r, int64_t hkv, int64_t page_size, bool json);

/* The kernel settings of the GPU subcommands (plan, tune): the defaults, then the environment
 * variables the daemon reads for the same settings (FA_WGMMA, FA_WGMMA16, FA_NVRTC_EXTRA, ...,
 * kernels/fa_settings.h), so fa-ctl plans and tunes what the daemon would run. A bad value is
 * printed as "fa-ctl: <cmd>: ..." on stderr and FA_CTL_EXIT_USAGE returned (the exit status);
 * 0 otherwise. */
int fa_ctl_kernel_settings(struct fa_kernel_settings *ks, const char *cmd);

#endif /* FA_CTL_H */
