/* fa_ctl_util.c - what every fa-ctl subcommand shares: the one error prefix and the exit status
 * it stands for, JSON strings, and the kernel settings read from the environment. A file of its
 * own below fa_ctl.c and the subcommands, so no subcommand calls back into the dispatcher. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "fa_ctl.h"
#include "fa_settings.h"

__attribute__((format(printf, 2, 0))) static void vreport(const char *cmd, const char *fmt, va_list ap)
{
	if (cmd != NULL)
		fprintf(stderr, "fa-ctl: %s: ", cmd);
	else
		fputs("fa-ctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

int fa_ctl_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(cmd, fmt, ap);
	va_end(ap);
	return FA_CTL_EXIT_USAGE;
}

int fa_ctl_failure(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(cmd, fmt, ap);
	va_end(ap);
	return FA_CTL_EXIT_FAILURE;
}

void fa_ctl_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", f);
		else if (*p == '\t')
			fputs("\\t", f);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

int fa_ctl_kernel_settings(struct fa_kernel_settings *ks, const char *cmd)
{
	char err[256];
	fa_kernel_settings_init(ks);
	for (const char *const *n = fa_kernel_settings_names(); *n; n++)
		if (fa_kernel_settings_set(ks, *n, getenv(*n), err, sizeof err) != FA_OK) {
			return fa_ctl_usage_error(cmd, "%s", err);
		}
	return 0;
}
