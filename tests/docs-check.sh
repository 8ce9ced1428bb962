#!/bin/sh
# docs-check.sh - every relative link in the repository's Markdown files ([text](path) and
# [text](path#anchor)) names a file or folder that exists, so the README's pointers to docs/
# and between folders never dangle. The research notes under docs/research/ are kept as
# written and skipped (their paths are the workspace's). Also: no tracked text file keeps a
# merge's conflict markers (a merge resolved in haste once left them in tests/README.md).
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
# conflict markers: a line that is exactly a marker, at the start of a line (git grep -I skips
# binary files; the corpus and research notes are data, not merges)
if git rev-parse --git-dir > /dev/null 2>&1; then
	left=$(git grep -I -n -E '^(<<<<<<< |>>>>>>> |=======$)' -- . ':!tests/fuzz/corpus' \
	       ':!docs/research' 2>/dev/null || true)
	if [ -n "$left" ]; then
		echo "docs-check: merge conflict markers left in:" >&2
		echo "$left" >&2
		bad=1
	fi
fi
[ "$bad" = 0 ] || exit 1
echo "docs-check: every relative Markdown link resolves; no conflict markers left"
