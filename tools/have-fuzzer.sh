#!/bin/sh
# have-fuzzer.sh - exit 0 when clang can build a libFuzzer target here (compiler and runtime).
command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1 || exit 1
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){(void)d;(void)n;return 0;}\n' |
	"${FUZZ_CC:-clang}" -x c - -fsanitize=fuzzer -o /dev/null >/dev/null 2>&1
