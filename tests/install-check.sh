#!/bin/sh
# install-check.sh BUILD - install into a scratch DESTDIR, then build and run a program against the
# installed library the way a user would: `pkg-config --cflags --libs libfaclient`, one header.
# Checks the soname link, the .pc file, the headers' self-sufficiency (fa_client.h and the
# fa_types.h it includes, each alone) and that the exported symbols are exactly the FA_API
# functions the installed headers declare.
set -eu
build=$1
dest=$(mktemp -d "${TMPDIR:-/tmp}/fa-install.XXXXXX")
trap 'rm -rf "$dest"' EXIT
make --no-print-directory -s BUILD="$build" PREFIX=/usr DESTDIR="$dest" install >/dev/null
for f in usr/bin/fa-daemon usr/bin/fa-ctl usr/include/fa/fa_client.h usr/include/fa/fa_types.h \
	usr/lib/libfaclient.a \
	usr/lib/libfaclient.so usr/lib/libfaclient.so.0 usr/lib/pkgconfig/libfaclient.pc; do
	[ -e "$dest/$f" ] || { echo "install-check: $f was not installed" >&2; exit 1; }
done
cat > "$dest/hello.c" <<'C'
#include <fa/fa_client.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	fa_client *c = NULL;
	/* No daemon on this path: the library must say so, not hang or crash. */
	fa_status st = fa_client_open(&c, "ipc:///nonexistent/fa-install-check.sock");
	printf("libfaclient %s: open without a daemon -> %s\n", fa_version_string(),
	       fa_status_name(st));
	/* The 16-bit converters C users fill tensors with. */
	int conv = fa_bf16_from_float(1.0f) == 0x3f80 && fa_fp16_from_float(1.0f) == 0x3c00 &&
	           fa_float_from_bf16(0x4000) == 2.0f && fa_float_from_fp16(0x4000) == 2.0f;
	return st == FA_EUNAVAIL && c == NULL && strcmp(fa_status_name(FA_ERANGE), "FA_ERANGE") == 0 &&
	               conv ? 0 : 1;
}
C
export PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH="$dest/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --cflags --libs libfaclient)
${CC:-cc} -std=c11 -Wall -Werror -o "$dest/hello" "$dest/hello.c" $flags
# fa_types.h alone: a program that needs only the statuses and enums.
printf '#include <fa/fa_types.h>\nint fa_check_types(void);\nint fa_check_types(void) { return FA_ERANGE + FA_DTYPE_BF16; }\n' > "$dest/types.c"
${CC:-cc} -std=c11 -Wall -Werror -c -o "$dest/types.o" "$dest/types.c" $(pkg-config --cflags libfaclient)
LD_LIBRARY_PATH="$dest/usr/lib" "$dest/hello"
# README.md's recipe for a prefix the loader does not search: without LD_LIBRARY_PATH the plain
# build cannot start, the one linked with an rpath to the .pc's libdir can.
if env -u LD_LIBRARY_PATH "$dest/hello" >/dev/null 2>"$dest/noload" ||
	! grep -q 'libfaclient.so.0' "$dest/noload"; then
	echo "install-check: a program built against a non-system prefix started without its library path" >&2
	exit 1
fi
# (pkgconf puts the sysroot in front of --variable too: the libdir is $dest/usr/lib here.)
${CC:-cc} -std=c11 -Wall -Werror -o "$dest/hello-rpath" "$dest/hello.c" $flags \
	-Wl,-rpath,"$(pkg-config --variable=libdir libfaclient)"
env -u LD_LIBRARY_PATH "$dest/hello-rpath" >/dev/null
# The shared object exports the API and nothing else: exactly the FA_API functions declared in the
# installed headers (internal fa__ names and common/'s fa_ helpers are hidden).
nm -D --defined-only "$dest/usr/lib/libfaclient.so.0" | awk '{print $3}' | sort > "$dest/exported"
sed -n 's/^FA_API [^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' "$dest"/usr/include/fa/*.h | sort -u > "$dest/declared"
if ! cmp -s "$dest/exported" "$dest/declared"; then
	echo "install-check: exports differ from the FA_API declarations (< exported, > declared):" >&2
	diff "$dest/exported" "$dest/declared" | grep '^[<>]' >&2
	exit 1
fi
echo "install-check: ok ($(nm -D --defined-only "$dest/usr/lib/libfaclient.so.0" | grep -c ' T fa_') API functions exported)"

# ---- units, man pages, uninstall -----------------------------------------------------------------
# The units' ExecStart= follows PREFIX; both set a LimitNOFILE= whose hard limit fits the default
# connection cap plus the daemon's headroom (it raises its soft limit itself).
units=$(mktemp -d "${TMPDIR:-/tmp}/fa-units.XXXXXX")
trap 'rm -rf "$dest" "$units"' EXIT
make --no-print-directory -s BUILD="$build" PREFIX=/opt/fa DESTDIR="$units" install install-systemd >/dev/null
for u in lib/systemd/system/fa-daemon.service lib/systemd/user/fa-daemon-user.service; do
	f="$units/opt/fa/$u"
	[ -f "$f" ] || { echo "install-check: $u was not installed" >&2; exit 1; }
	grep -q '^ExecStart=/opt/fa/bin/fa-daemon ' "$f" ||
		{ echo "install-check: $u: ExecStart= does not follow PREFIX=/opt/fa" >&2; exit 1; }
	! grep -q '@[A-Z]*@' "$f" || { echo "install-check: $u: a template key left" >&2; exit 1; }
	hard=$(sed -n 's/^LimitNOFILE=[0-9]*:\([0-9]*\)$/\1/p' "$f")
	conns=$("$build/fa-daemon" --help | sed -n '/--max-connections N/,/env/p' | sed -n 's/.*Default \([0-9]*\).*/\1/p' | head -1)
	headroom=$(sed -n 's/^#define SERVER_FD_HEADROOM \([0-9]*\).*/\1/p' daemon/server.h)
	[ -n "$hard" ] && [ -n "$conns" ] && [ -n "$headroom" ] && [ "$hard" -ge $((conns + headroom)) ] ||
		{ echo "install-check: $u: LimitNOFILE hard limit '$hard' below $conns connections + $headroom" >&2; exit 1; }
done
# Man pages: installed, no groff warning (-ww), every fa-ctl command and every fa-daemon option.
for m in share/man/man8/fa-daemon.8 share/man/man1/fa-ctl.1; do
	[ -f "$units/opt/fa/$m" ] || { echo "install-check: $m was not installed" >&2; exit 1; }
done
if command -v groff >/dev/null 2>&1; then
	for m in "$units"/opt/fa/share/man/man*/*; do
		w=$(groff -man -Tutf8 -ww -z "$m" 2>&1)
		[ -z "$w" ] || { echo "install-check: groff warns on $m: $w" >&2; exit 1; }
	done
	groff -man -Tutf8 "$units/opt/fa/share/man/man1/fa-ctl.1" 2>/dev/null | sed 's/.\x08//g' > "$dest/ctl.txt"
	for c in $("$build/fa-ctl" --help | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF {print $1}'); do
		grep -q "^       $c" "$dest/ctl.txt" || { echo "install-check: fa-ctl.1 lacks the command $c" >&2; exit 1; }
	done
	groff -man -Tutf8 "$units/opt/fa/share/man/man8/fa-daemon.8" 2>/dev/null | sed 's/.\x08//g' > "$dest/daemon.txt"
	for o in $("$build/fa-daemon" --help | grep -o -- '--[a-z0-9-]*' | sort -u); do
		grep -q -- "$o" "$dest/daemon.txt" || { echo "install-check: fa-daemon.8 lacks $o" >&2; exit 1; }
	done
else
	echo "install-check: groff is not installed: man pages not rendered"
fi
make --no-print-directory -s BUILD="$build" PREFIX=/opt/fa DESTDIR="$units" uninstall >/dev/null
left=$(find "$units" -type f)
[ -z "$left" ] || { echo "install-check: uninstall left: $left" >&2; exit 1; }
echo "install-check: units follow PREFIX, LimitNOFILE fits, man pages clean, uninstall complete"
