#!/bin/sh
# sass-diff.sh A B - compare the SASS of the cubins two tools/sass-dump runs wrote (same names):
# cuobjdump -sass per cubin, addresses, encodings and comments dropped, then diffed. Prints one
# line per specialisation (same / DIFF / missing) and a count. CUOBJDUMP names the tool
# (default: cuobjdump on the path, else /opt/cudatools/cuobjdump); its -sass needs nvdisasm on the
# PATH (PyPI's nvidia-cuda-nvdisasm has one). Typical use: build sass-dump in a worktree of the
# base commit and in this tree, run both into two folders, then this.
set -u
a=$1 b=$2
obj=${CUOBJDUMP:-$(command -v cuobjdump || echo /opt/cudatools/cuobjdump)}
norm() {
	"$obj" -sass "$1" | sed -e 's@/\*[0-9a-f]*\*/@@g' -e 's@/\* 0x[0-9a-f]* \*/@@g' \
		-e 's/[[:space:]]*$//' -e '/^[[:space:]]*$/d' | grep -v 'code for sm_\|Function :\|\.headerflags\|arch = '
}
same=0 diff=0 miss=0
for f in "$a"/*.cubin; do
	n=$(basename "$f")
	if [ ! -f "$b/$n" ]; then
		echo "missing  $n"; miss=$((miss + 1)); continue
	fi
	if norm "$f" > /tmp/sass-a.$$ && norm "$b/$n" > /tmp/sass-b.$$ && cmp -s /tmp/sass-a.$$ /tmp/sass-b.$$; then
		echo "same     $n"; same=$((same + 1))
	else
		echo "DIFF     $n ($(diff /tmp/sass-a.$$ /tmp/sass-b.$$ | grep -c '^[<>]') lines)"; diff=$((diff + 1))
	fi
done
rm -f /tmp/sass-a.$$ /tmp/sass-b.$$
echo "sass-diff: $same identical, $diff different, $miss missing"
[ "$diff" -eq 0 ] && [ "$miss" -eq 0 ]
