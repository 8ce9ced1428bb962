#!/bin/sh
# install-check.sh BUILD - install into a scratch DESTDIR, then build and run a program against the
# installed library the way a user would: `pkg-config --cflags --libs libfaclient`, one header.
# Checks the soname link, the .pc file, the header's self-sufficiency and the exported API.
set -eu
build=$1
dest=$(mktemp -d "${TMPDIR:-/tmp}/fa-install.XXXXXX")
trap 'rm -rf "$dest"' EXIT
make --no-print-directory -s BUILD="$build" PREFIX=/usr DESTDIR="$dest" install >/dev/null
for f in usr/bin/fa-daemon usr/bin/fa-ctl usr/include/fa/fa_client.h usr/lib/libfaclient.a \
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
	return st == FA_EUNAVAIL && c == NULL && strcmp(fa_status_name(FA_ERANGE), "FA_ERANGE") == 0
	               ? 0 : 1;
}
C
export PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH="$dest/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --cflags --libs libfaclient)
${CC:-cc} -std=c11 -Wall -Werror -o "$dest/hello" "$dest/hello.c" $flags
LD_LIBRARY_PATH="$dest/usr/lib" "$dest/hello"
# The shared object exports the API and nothing else.
extra=$(nm -D --defined-only "$dest/usr/lib/libfaclient.so.0" | awk '{print $3}' | grep -v '^fa_' || true)
[ -z "$extra" ] || { echo "install-check: unexpected exports: $extra" >&2; exit 1; }
echo "install-check: ok ($(nm -D --defined-only "$dest/usr/lib/libfaclient.so.0" | grep -c ' T fa_') API functions exported)"
