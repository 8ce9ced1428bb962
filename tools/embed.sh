#!/bin/sh
# embed.sh FILE SYMBOL - print a C file defining `const char SYMBOL[]` with FILE's text, and
# `const unsigned long SYMBOL_len`. The daemon hands kernels/*.cu to NVRTC this way, so the
# installed binary needs no source tree.
set -eu
printf '/* generated from %s by tools/embed.sh: do not edit */\n' "$1"
printf 'const char %s[] =\n' "$2"
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$/\\n"/' "$1"
printf ';\nconst unsigned long %s_len = sizeof(%s) - 1;\n' "$2" "$2"
