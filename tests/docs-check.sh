#!/bin/sh
# docs-check.sh - every relative link in the repository's Markdown files ([text](path) and
# [text](path#anchor)) names a file or folder that exists, so the README's pointers to docs/
# and between folders never dangle. The research notes under docs/research/ are kept as
# written and skipped (their paths are the workspace's).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bad=0
for md in $(git ls-files '*.md' 2>/dev/null || find . -name '*.md' -not -path './build*'); do
	case $md in docs/research/*) continue ;; esac
	dir=$(dirname "$md")
	# [text](target): targets without a scheme, without the #anchor
	for t in $(grep -o '\]([^)]*)' "$md" | sed 's/^](//; s/)$//; s/#.*//' | grep -v '^[a-z][a-z]*:' | grep -v '^$' || true); do
		if [ ! -e "$dir/$t" ]; then
			echo "docs-check: $md links to $t, which does not exist" >&2
			bad=1
		fi
	done
done
[ "$bad" = 0 ] || exit 1
echo "docs-check: every relative Markdown link resolves"
