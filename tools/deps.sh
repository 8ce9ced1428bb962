#!/bin/sh
# deps.sh check|install|python - make sure the libraries fa builds against are present.
# `check` installs what is missing when run as root (Debian), otherwise prints the exact command
# and fails; `python` installs the Python tests' packages (python3-numpy, python3-venv) or warns.
# The fuzzing tools (clang with libFuzzer's runtime) are installed the same way when
# possible, but their absence only warns: `make fuzz` then says it skips (and fails under CI=true). A library that pkg-config already finds counts as present, so hosts without a
# package registry (the GPU host, after `. .gpu-deps/env.sh`) pass.
set -u
mode=${1:-check}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
missing=""

# `python`: what the Python package's tests need beyond python3 itself (Debian's NumPy, and venv
# for the pip install test), for Debian's own python3; installed when root, else a warning.
# Never python3 itself: without it the Python tests say so and skip.
if [ "$mode" = python ]; then
	py=/usr/bin/python3
	[ -x "$py" ] || exit 0
	"$py" -c 'import numpy, venv, ensurepip' >/dev/null 2>&1 && exit 0
	pkgs="python3-numpy python3-venv"
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
		{ [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v -e lock -e partial)" ] ||
			apt-get update -qq >/dev/null 2>&1; } &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -qq \
			$pkgs >/dev/null 2>&1; then
		echo "deps: installed $pkgs"
		exit 0
	fi
	echo "deps: warning: $pkgs not installed (run as root: apt-get install $pkgs)" >&2
	exit 1
fi

have_pc() { command -v "$PKG_CONFIG" >/dev/null 2>&1 && "$PKG_CONFIG" --exists "$1" 2>/dev/null; }

command -v "$PKG_CONFIG" >/dev/null 2>&1 || missing="$missing pkg-config"
have_pc libuv || missing="$missing libuv1-dev"
have_pc nanomsg || missing="$missing libnanomsg-dev"
have_pc msgpack-c || have_pc msgpack || missing="$missing libmsgpack-dev"
have_pc cmocka || missing="$missing libcmocka-dev"
# Optional: clang builds the libFuzzer target; libFuzzer's runtime may be missing from a clang
# installed without recommends.
optional=""
if ! sh "$(dirname "$0")/have-fuzzer.sh"; then
	command -v clang >/dev/null 2>&1 || optional="clang"
	optional="$optional libclang-rt-dev"
fi

# The optional tools: try to install them where we can, warn otherwise.
if [ -n "$optional" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
		{ [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v -e lock -e partial)" ] ||
			apt-get update -qq >/dev/null 2>&1; } &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -qq \
			$optional >/dev/null 2>&1; then
		echo "deps: installed $optional"
	else
		echo "deps: warning: $optional not installed: fuzzing will be skipped" >&2
	fi
fi

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
