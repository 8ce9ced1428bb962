#!/bin/sh
# deps.sh check|install - make sure the libraries fa builds against are present.
# `check` installs what is missing when run as root (Debian), otherwise prints the exact command
# and fails. A library that pkg-config (or the compiler, for NNG) already finds counts as present,
# so hosts without a package registry (the GPU host, after `. .gpu-deps/env.sh`) pass.
set -u
mode=${1:-check}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
missing=""

have_pc() { command -v "$PKG_CONFIG" >/dev/null 2>&1 && "$PKG_CONFIG" --exists "$1" 2>/dev/null; }
have_hdr() { # header, library: compile and link a one-liner
	printf '#include <%s>\nint main(void){return 0;}\n' "$1" |
		${CC:-cc} -x c - -o /dev/null "$2" >/dev/null 2>&1
}

command -v "$PKG_CONFIG" >/dev/null 2>&1 || missing="$missing pkg-config"
have_pc libuv || missing="$missing libuv1-dev"
have_pc nanomsg || missing="$missing libnanomsg-dev"
have_pc nng || have_hdr nng/nng.h -lnng || missing="$missing libnng-dev"
have_pc msgpack-c || have_pc msgpack || missing="$missing libmsgpack-dev"
have_pc cmocka || missing="$missing libcmocka-dev"
# clang builds the libFuzzer target; its runtime comes with Debian's clang packages.
command -v clang >/dev/null 2>&1 || missing="$missing clang"

if [ -z "$missing" ]; then
	[ "$mode" = install ] && echo "deps: everything is installed"
	exit 0
fi
cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "deps: installing$missing"
	# A fresh machine has empty package lists.
	if [ -z "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v -e lock -e partial)" ]; then
		apt-get update -qq || exit 1
	fi
	DEBIAN_FRONTEND=noninteractive $cmd -qq >/dev/null || {
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive $cmd -qq >/dev/null; } || exit 1
	exit 0
fi
echo "deps: missing:$missing" >&2
echo "deps: run as root:  apt-get update && $cmd" >&2
exit 1
